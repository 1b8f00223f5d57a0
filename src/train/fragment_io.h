// Moving fragments between a GPT's parameters and flat fp32 buffers (docs/protocol.md §3 steps 5–6,
// §8). The layout is computed from the model's (name, shape) list, so every process derives the same one.
// Copies go block by block through LibTorch, so parameters may live on any device; they are changed in place
// under NoGradGuard (the optimizer's moments stay attached to the same tensors).
#pragma once

#include <span>
#include <vector>

#include "core/config.h"
#include "core/fragments.h"
#include "model/gpt.h"

namespace dloco {

/// (name, shape) of every parameter, in the model's registration order.
std::vector<TensorSpec> parameter_specs(GPT& model);

/// The same list from the config alone, without building the model (what GPT(cfg) would register: "wte.weight" (V, C),
/// per block i "h.i.ln_1.weight" (C), "h.i.attn.qkv.weight" (3C, C), "h.i.attn.proj.weight" (C, C), "h.i.ln_2.weight"
/// (C), "h.i.mlp.{gate,up}.weight" (F, C), "h.i.mlp.down.weight" (C, F), then "ln_f.weight" (C) and, untied,
/// "lm_head.weight" (V, C); FragmentIo.SpecsFromTheConfigAreTheModels pins it). For ranks that never build the model
/// (sharded initialisation, parallel/sharded_init.h).
std::vector<TensorSpec> parameter_specs(const ModelConfig& cfg);

/// The fragment layout of `model` for diloco.fragments (P) and diloco.split_large_tensors.
/// Throws InputError if P exceeds the number of blocks.
FragmentLayout model_layout(GPT& model, const DilocoConfig& diloco);
/// The same from the config alone (parameter_specs(cfg)).
FragmentLayout model_layout(const ModelConfig& cfg, const DilocoConfig& diloco);

/// Model parameters in the layout's tensor order (name-sorted), for gather/scatter.
std::vector<torch::Tensor> layout_parameters(GPT& model, const FragmentLayout& layout);

/// Copies fragment p of the parameters into `out` (layout.fragments[p].numel values, blocks in layout order).
void gather_parameters(const std::vector<torch::Tensor>& params, const FragmentLayout& layout, int p,
                       std::span<float> out);

/// Overwrites fragment p of the parameters with `in` (in place).
void scatter_parameters(const std::vector<torch::Tensor>& params, const FragmentLayout& layout, int p,
                        std::span<const float> in);

}  // namespace dloco
