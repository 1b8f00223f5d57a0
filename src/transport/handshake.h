// The handshake every process computes from its own config, fragment layout and tokenizer; the syncer and the
// peer servers compare what they receive with their own (wire::check_handshake).
#pragma once

#include <vector>

#include "core/config.h"
#include "core/fragments.h"
#include "transport/protocol.h"
#include "transport/transport.h"

namespace dloco {

/// The settings every process of a run must share, typed as the config's fields (wire::Setting), in the order of
/// to_json(config): every [model] field ("model.d_model"), [train] without the role-local eval_interval, eval_tokens,
/// checkpoint_interval, learner_state_interval and log_interval ("train.lr"), all of [diloco] ("diloco.outer_lr"),
/// "data.streams" and "data.order" (docs/protocol.md §7 "Handshake"). Choices are strings ("rda"). Every field of
/// these sections is a scalar today; an array or object would be flattened, its elements named "name[i]" and
/// "name.key".
std::vector<wire::Setting> handshake_settings(const Config& config);

/// The run's secret: env DLOCO_SECRET when set, else run.secret. Throws InputError if DLOCO_SECRET is not printable
/// ASCII without spaces or is over 256 bytes.
std::string run_secret(const Config& config);

/// What this process's transport authenticates and encrypts with (docs/protocol.md §12): the secret, the PEM texts
/// of run.tls_cert / tls_key / tls_ca (read now), run.tls_mutual and run.insecure. Throws InputError naming the field
/// if a file cannot be read or is not PEM.
wire::Security transport_security(const Config& config);

/// This process's handshake: run id (run.name), protocol version, secret (env DLOCO_SECRET overrides
/// run.secret), the hashes of `layout` and of the tokenizer in data.dir, and handshake_settings().
/// Throws InputError if the tokenizer is missing.
wire::Handshake make_handshake(const Config& config, const FragmentLayout& layout);

}  // namespace dloco
