// The handshake; see handshake.h.
#include "transport/handshake.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/hash.h"
#include "process/file_hash.h"

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

std::string run_secret(const Config& config) {
  const char* env = std::getenv("DLOCO_SECRET");
  if (!env || !*env) return config.run.secret;  // validated with the config
  const std::string secret(env);
  const bool printable = std::all_of(secret.begin(), secret.end(), [](char ch) { return ch > ' ' && ch < 127; });
  if (!printable || secret.size() > 256) {
    throw InputError("DLOCO_SECRET must be printable ASCII without spaces, at most 256 bytes (it travels as a bearer "
                     "token)");
  }
  return secret;
}

namespace {

std::string read_pem(const std::string& path, const char* field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(std::string(field) + ": cannot read '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > (1 << 20) || text.find("-----BEGIN ") == std::string::npos) {
    throw InputError(std::string(field) + ": '" + path + "' is not a PEM file (no -----BEGIN line, or over 1 MiB)");
  }
  return text;
}

}  // namespace

wire::Security transport_security(const Config& config) {
  wire::Security s;
  s.secret = run_secret(config);
  if (!config.run.tls_ca.empty()) {
    s.cert_pem = read_pem(config.run.tls_cert, "run.tls_cert");
    s.key_pem = read_pem(config.run.tls_key, "run.tls_key");
    s.ca_pem = read_pem(config.run.tls_ca, "run.tls_ca");
  }
  s.mutual = config.run.tls_mutual;
  s.insecure = config.run.insecure;
  return s;
}

wire::Handshake make_handshake(const Config& config, const FragmentLayout& layout) {
  wire::Handshake h;
  h.run_id = config.run.name;
  h.protocol_version = wire::kProtocolVersion;
  h.secret = run_secret(config);
  h.layout_hash = layout.hash;
  h.model_hash = model_config_hash(config.model);
  h.tokenizer_hash = file_fnv1a64(std::filesystem::path(config.data.dir) / "tokenizer.model", "tokenizer");
  h.training = training_settings_json(config);
  return h;
}

}  // namespace dloco
