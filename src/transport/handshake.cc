// The handshake; see handshake.h.
#include "transport/handshake.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "process/file_hash.h"

namespace dloco {

namespace {

// Appends `value` as the setting(s) named `name`: a scalar as one, an array's elements as name[i], an object's
// members as name.key (none of the handshake's fields is one today).
void add_settings(const std::string& name, const nlohmann::json& value, std::vector<wire::Setting>& out) {
  using Type = nlohmann::json::value_t;
  switch (value.type()) {
    case Type::number_integer: out.push_back({name, value.get<int64_t>()}); return;
    case Type::number_unsigned: {
      const uint64_t u = value.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) throw InvariantError("setting " + name + " is over the int64 range");
      out.push_back({name, static_cast<int64_t>(u)});
      return;
    }
    case Type::number_float: out.push_back({name, value.get<double>()}); return;
    case Type::boolean: out.push_back({name, value.get<bool>()}); return;
    case Type::string: out.push_back({name, value.get<std::string>()}); return;
    case Type::array:
      for (size_t i = 0; i < value.size(); ++i) add_settings(name + "[" + std::to_string(i) + "]", value[i], out);
      return;
    case Type::object:
      for (const auto& [key, member] : value.items()) add_settings(name + "." + key, member, out);
      return;
    default: throw InvariantError("setting " + name + " has no value type (" + value.type_name() + ")");
  }
}

}  // namespace

std::vector<wire::Setting> handshake_settings(const Config& config) {
  const nlohmann::json all = to_json(config);
  nlohmann::json train = all.at("train");
  // Role-local: how often this process evaluates, checkpoints, saves its AdamW state and prints.
  for (const char* local : {"eval_interval", "eval_tokens", "checkpoint_interval", "learner_state_interval",
                            "log_interval"}) {
    train.erase(local);
  }
  std::vector<wire::Setting> out;
  add_settings("model", all.at("model"), out);
  add_settings("train", train, out);
  add_settings("diloco", all.at("diloco"), out);
  add_settings("data.streams", all.at("data").at("streams"), out);
  add_settings("data.order", all.at("data").at("order"), out);
  return out;
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
  h.tokenizer_hash = file_fnv1a64(std::filesystem::path(config.data.dir) / "tokenizer.model", "tokenizer");
  h.settings = handshake_settings(config);
  return h;
}

}  // namespace dloco
