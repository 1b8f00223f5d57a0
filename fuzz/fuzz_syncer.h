// The run the syncer's fuzz targets (syncer_rpc.cc, syncer_restore.cc) and their seeds (make_seeds.cc) share:
// M = 3 learners, H = 4, P = 2 fragments, τ = 2, K = 2, 64 tokens a step, a 512-value model of two tensors.
#pragma once

#include "core/config.h"
#include "core/fragments.h"
#include "transport/protocol.h"

namespace dloco::fuzz {

inline constexpr int kTokensPerStep = 64;

inline Config syncer_config() {
  Config c;
  c.run.name = "fuzz";
  c.diloco.learners = 3;
  c.diloco.inner_steps = 4;
  c.diloco.fragments = 2;
  c.diloco.overlap = 2;
  c.diloco.quorum = 2;
  c.train.checkpoint_interval = 0;
  c.train.total_tokens = 3 * 40 * kTokensPerStep;
  c.train.batch_size = 1;  // B·T·grad_accum = 64 tokens a step (the syncer bounds claims by it)
  c.train.grad_accum = 1;
  c.model.seq_len = kTokensPerStep;
  return c;
}

inline FragmentLayout syncer_layout() {
  return make_fragment_layout({{"a.weight", {40, 8}}, {"b.weight", {24, 8}}}, 2);
}

/// The handshake every process of that run sends (tokenizer hash stand-in 2, no settings).
inline wire::Handshake syncer_handshake(const FragmentLayout& layout) {
  return {"fuzz", wire::kProtocolVersion, "", layout.hash, 2, {}};
}

}  // namespace dloco::fuzz
