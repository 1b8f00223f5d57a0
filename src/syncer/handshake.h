// The handshake every peer computes from its own config, model and tokenizer; the syncer compares.
#pragma once

#include "core/config.h"
#include "core/fragments.h"
#include "proto/dloco.pb.h"

namespace dloco {

struct HandshakeExpectation;

/// Fills the handshake of this process: run id, protocol version, secret (env DLOCO_SECRET overrides
/// run.secret), and the hashes of `layout`, the model config and the tokenizer in data.dir.
/// Throws InputError if the tokenizer is missing.
v1::Handshake make_handshake(const Config& config, const FragmentLayout& layout);

/// The same values, as the syncer's expectation.
HandshakeExpectation expected_handshake(const Config& config, const FragmentLayout& layout);

}  // namespace dloco
