// Writes the binary part of the fuzz targets' seed corpus (fuzz/README.md): well-formed inputs each target's
// decoder takes, so the fuzzers start from deep inside the formats. The text seeds (configs, fault plans) are the
// repository's own files, copied by scripts/fuzz.sh. Run: build-fuzz/bin/fuzz_make_seeds fuzz/corpus
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "core/fragments.h"
#include "core/safetensors.h"
#include "data/shards.h"
#include "data/stream_log.h"
#include "fuzz/fuzz_syncer.h"
#include "process/events.h"
#include "syncer/syncer_service.h"
#include "syncer/syncer_store.h"
#include "transport/codec.h"
#include "transport/grpc/proto_convert.h"

using namespace dloco;
namespace fs = std::filesystem;

namespace {

fs::path out_root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = out_root / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i % 13) - 6);
  return v;
}

// One record of the syncer_rpc script: [kind][length LE16][message].
std::string record(int kind, const google::protobuf::MessageLite& m) {
  const std::string body = m.SerializeAsString();
  std::string out(3, '\0');
  out[0] = static_cast<char>(kind);
  out[1] = static_cast<char>(body.size() & 0xff);
  out[2] = static_cast<char>((body.size() >> 8) & 0xff);
  return out + body;
}

// The fuzz targets' run (fuzz/syncer_rpc.cc, fuzz/syncer_restore.cc): two fragments of a 512-value model.
FragmentLayout fuzz_layout() { return fuzz::syncer_layout(); }

void codec_seeds() {
  const auto values = ramp(100, 0.01f);
  for (auto [codec, block, name] : {std::tuple{wire::Codec::kFp32, 0, "fp32"}, {wire::Codec::kBf16, 0, "bf16"},
                                     {wire::Codec::kQ8, 0, "q8"}, {wire::Codec::kQ4, 0, "q4"},
                                     {wire::Codec::kQ8, 16, "q8_16"}, {wire::Codec::kQ4, 8, "q4_8"},
                                     {wire::Codec::kTopK, 64, "topk_64"}}) {
    const wire::Payload p = wire::encode(values, codec, block);
    put("codec", name, p.codec + "\n" + p.bytes);
  }
  const wire::Payload sparse16 = wire::encode(values, wire::Codec::kTopK, 64, 16);  // "topk/64/16"
  put("codec", "topk_64_16", sparse16.codec + "\n" + sparse16.bytes);
}

void syncer_rpc_seeds() {
  const FragmentLayout layout = fuzz_layout();
  for (int knobs : {0, 1, 2 | 4 | 8, 16}) {
    std::string script(1, static_cast<char>(knobs));
    for (int id = 0; id < 2; ++id) {
      v1::JoinRequest join;
      join.set_learner_id(id);
      join.set_host("seed");
      script += record(1, join);
      for (int step = 1; step <= 8; ++step) {
        v1::LearnerMessage m;
        auto* meta = m.mutable_metadata();
        meta->set_step(step);
        for (int p = 0; p < 2; ++p) {
          meta->add_steps(step);
          meta->add_tokens(64 * step);
          meta->add_versions(0);
        }
        meta->set_step_time_s(0.01);
        meta->set_tokens_trained(64 * step);
        meta->set_stream(id);
        script += record(2, m);
      }
      for (int p = 0; p < 2; ++p) {
        v1::LearnerMessage m;
        auto* a = m.mutable_answer();
        a->set_fragment(p);
        a->set_round_step(p == 0 ? 4 : 6);
        a->set_captured_step(p == 0 ? 4 : 6);
        a->set_base_version(0);
        a->set_steps(p == 0 ? 4 : 6);
        a->set_tokens(64 * (p == 0 ? 4 : 6));
        const wire::Payload delta = wire::encode(ramp(layout.fragments[p].numel, 1e-3f * (id + 1)),
                                                 (knobs & 4) ? wire::Codec::kQ8 : wire::Codec::kFp32);
        a->set_dtype(delta.codec);
        a->set_delta(delta.bytes);
        script += record(2, m);
      }
      script += record(7, v1::StatusRequest{});
    }
    v1::FragmentRequest fragment;
    fragment.set_fragment(1);
    script += record(3, fragment);
    script += record(4, v1::SnapshotRequest{});
    script += record(5, v1::StatusRequest{});
    v1::EvalReport eval;
    eval.set_global_step(4);
    eval.set_val_loss(3.5);
    script += record(6, eval);
    put("syncer_rpc", "script_" + std::to_string(knobs), script);
  }
}

void safetensors_seeds() {
  const auto a = ramp(12, 0.5f);
  const std::vector<int64_t> ints{1, 2, 3};
  std::vector<SafetensorsEntry> entries{f32_entry("a.weight", {3, 4}, a),
                                        {"count", Dtype::kI64, {3}, std::as_bytes(std::span(ints))}};
  const auto image = encode_safetensors(entries, {{"version", "3"}});
  put("safetensors", "two_tensors", std::string(reinterpret_cast<const char*>(image.data()), image.size()));
}

void shard_seeds(const fs::path& tmp) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 200; ++i) tokens.push_back((i * 7) % 100);
  write_shard(tmp / "small.bin", tokens, 100);
  put("shard", "uint16", read_all(tmp / "small.bin"));
  write_shard(tmp / "wide.bin", tokens, 70000);
  put("shard", "uint32", read_all(tmp / "wide.bin"));
}

void stream_log_seeds(const fs::path& tmp) {
  {
    StreamLog log(tmp / "stream_0.jsonl");
    StreamCursor c;
    for (int i = 0; i < 5; ++i) {
      log.take(c, i % 2, i + 1);
      c.position += 64;
      c.tokens_served += 64;
    }
  }
  put("stream_log", "five_batches", read_all(tmp / "stream_0.jsonl"));
  put("stream_log", "legacy_torn", "{\"stream\":0,\"position\":0,\"epoch\":0,\"tokens_served\":0,\"learner\":0,\"step\":1}\n{\"stream\":0,\"pos");
}

// A syncer that ran a little and stopped: its state.json and fragment 0's file.
void syncer_restore_seeds(const fs::path& tmp) {
  const FragmentLayout layout = fuzz_layout();
  const Config config = fuzz::syncer_config();
  const wire::Handshake handshake = fuzz::syncer_handshake(layout);
  const fs::path dir = tmp / "syncer_run";
  std::vector<std::vector<float>> theta;
  for (const auto& f : layout.fragments) theta.push_back(ramp(f.numel, 0.1f));
  {
    EventLog events(tmp / "syncer.jsonl", Role::kSyncer, 0);
    SyncerService service(config, std::make_unique<SyncerState>(config, layout, std::move(theta), [](const std::string&) { return false; }),
                          handshake, dir, &events,
                          [&](const std::vector<SafetensorsEntry>&, const nlohmann::json&, int64_t) { return dir / "ckpt"; });
    wire::JoinRequest join;
    join.handshake = handshake;
    join.learner_id = 0;
    if (!service.join(join).ok()) throw InputError("the seed syncer refused its learner");
    service.persist_final_state();
  }
  SyncerStore store(dir, layout.hash);
  store.write_fragment(0, 2, ramp(layout.fragments[0].numel, 0.2f), ramp(layout.fragments[0].numel, 0.01f));
  const std::string state = read_all(dir / "syncer" / "state.json");
  const std::string fragment = read_all(dir / "syncer" / "fragment_0000.safetensors");
  put("syncer_restore", "ran_a_little", state + "\n--fragment--\n" + fragment);
  put("syncer_restore", "no_state", "\n--fragment--\n" + fragment);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds OUT_DIR (fuzz/corpus)\n";
    return 2;
  }
  out_root = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("dloco_fuzz_seeds_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    codec_seeds();
    syncer_rpc_seeds();
    safetensors_seeds();
    shard_seeds(tmp);
    stream_log_seeds(tmp);
    syncer_restore_seeds(tmp);
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_seeds: " << e.what() << "\n";
    fs::remove_all(tmp);
    return 1;
  }
  fs::remove_all(tmp);
  return 0;
}
