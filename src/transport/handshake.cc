// The handshake; see handshake.h.
#include "transport/handshake.h"

#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "data/tokenizer.h"

namespace dloco {

uint64_t model_config_hash(const ModelConfig& model) {
  Config c;
  c.model = model;
  return fnv1a64(to_json(c)["model"].dump());
}

std::string training_settings_json(const Config& config) {
  const nlohmann::json all = to_json(config);
  nlohmann::json train = all["train"];
  // Role-local: how often this process evaluates, checkpoints, saves its AdamW state and prints.
  for (const char* local : {"eval_interval", "eval_tokens", "checkpoint_interval", "learner_state_interval",
                            "log_interval"}) {
    train.erase(local);
  }
  return nlohmann::json{{"train", train}, {"diloco", all["diloco"]}, {"data", {{"streams", config.data.streams}}}}
      .dump();  // nlohmann's objects are key-sorted: the text is canonical
}

wire::Handshake make_handshake(const Config& config, const FragmentLayout& layout) {
  const char* env = std::getenv("DLOCO_SECRET");
  wire::Handshake h;
  h.run_id = config.run.name;
  h.protocol_version = wire::kProtocolVersion;
  h.secret = env && *env ? std::string(env) : config.run.secret;
  h.layout_hash = layout.hash;
  h.model_hash = model_config_hash(config.model);
  h.tokenizer_hash = tokenizer_file_hash(std::filesystem::path(config.data.dir) / "tokenizer.model");
  h.training = training_settings_json(config);
  return h;
}

}  // namespace dloco
