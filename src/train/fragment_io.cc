// Fragment <-> parameter copies; see fragment_io.h.
#include "train/fragment_io.h"

#include "core/check.h"
#include "core/hash.h"

namespace dloco {

std::vector<TensorSpec> parameter_specs(GPT& model) {
  std::vector<TensorSpec> specs;
  for (const auto& p : model->named_parameters()) specs.push_back({p.key(), p.value().sizes().vec()});
  return specs;
}

std::vector<TensorSpec> parameter_specs(const ModelConfig& cfg) {
  const int64_t V = cfg.vocab_size, C = cfg.d_model, F = cfg.ff_dim();
  std::vector<TensorSpec> specs{{"wte.weight", {V, C}}};
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    specs.push_back({h + "ln_1.weight", {C}});
    specs.push_back({h + "attn.qkv.weight", {3 * C, C}});
    specs.push_back({h + "attn.proj.weight", {C, C}});
    specs.push_back({h + "ln_2.weight", {C}});
    specs.push_back({h + "mlp.gate.weight", {F, C}});
    specs.push_back({h + "mlp.up.weight", {F, C}});
    specs.push_back({h + "mlp.down.weight", {C, F}});
  }
  specs.push_back({"ln_f.weight", {C}});
  if (!cfg.tie_embeddings) specs.push_back({"lm_head.weight", {V, C}});
  return specs;
}

FragmentLayout model_layout(GPT& model, const DilocoConfig& diloco) {
  return make_fragment_layout(parameter_specs(model), static_cast<int>(diloco.fragments), diloco.split_large_tensors);
}

FragmentLayout model_layout(const ModelConfig& cfg, const DilocoConfig& diloco) {
  return make_fragment_layout(parameter_specs(cfg), static_cast<int>(diloco.fragments), diloco.split_large_tensors);
}

std::vector<torch::Tensor> layout_parameters(GPT& model, const FragmentLayout& layout) {
  auto named = model->named_parameters();
  std::vector<torch::Tensor> out;
  for (const auto& spec : layout.tensors) {
    const auto* t = named.find(spec.name);
    DLOCO_CHECK(t != nullptr);
    out.push_back(*t);
  }
  return out;
}

namespace {
// Calls f(flat parameter slice, offset within the fragment buffer, numel) for each block of fragment p.
template <class F>
void for_each_block(const std::vector<torch::Tensor>& params, const FragmentLayout& layout, int p, F&& f) {
  DLOCO_CHECK(p >= 0 && p < static_cast<int>(layout.fragments.size()));
  int64_t at = 0;
  for (const auto& b : layout.fragments[p].blocks) {
    f(params[b.tensor_index].view({-1}).narrow(0, b.offset, b.numel), at, b.numel);
    at += b.numel;
  }
}
}  // namespace

void gather_parameters(const std::vector<torch::Tensor>& params, const FragmentLayout& layout, int p,
                       std::span<float> out) {
  DLOCO_CHECK_EQ(static_cast<int64_t>(out.size()), layout.fragments[p].numel);
  torch::NoGradGuard no_grad;
  auto dst = torch::from_blob(out.data(), {static_cast<int64_t>(out.size())}, torch::kFloat);
  for_each_block(params, layout, p, [&](const torch::Tensor& src, int64_t at, int64_t n) {
    dst.narrow(0, at, n).copy_(src.detach());
  });
}

void scatter_parameters(const std::vector<torch::Tensor>& params, const FragmentLayout& layout, int p,
                        std::span<const float> in) {
  DLOCO_CHECK_EQ(static_cast<int64_t>(in.size()), layout.fragments[p].numel);
  torch::NoGradGuard no_grad;
  auto src = torch::from_blob(const_cast<float*>(in.data()), {static_cast<int64_t>(in.size())}, torch::kFloat);
  for_each_block(params, layout, p, [&](torch::Tensor dst, int64_t at, int64_t n) {
    dst.copy_(src.narrow(0, at, n));
  });
}

}  // namespace dloco
