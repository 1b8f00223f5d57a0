// The handshake every process computes from its own config, fragment layout and tokenizer; the syncer and the
// peer servers compare what they receive with their own (wire::check_handshake).
#pragma once

#include "core/config.h"
#include "core/fragments.h"
#include "transport/protocol.h"

namespace dloco {

/// FNV-1a 64 of the [model] config's JSON: the model part of the handshake.
uint64_t model_config_hash(const ModelConfig& model);

/// This process's handshake: run id (run.name), protocol version, secret (env DLOCO_SECRET overrides
/// run.secret), and the hashes of `layout`, the [model] config and the tokenizer in data.dir.
/// Throws InputError if the tokenizer is missing.
wire::Handshake make_handshake(const Config& config, const FragmentLayout& layout);

}  // namespace dloco
