#!/usr/bin/python3
"""Table and property tests of the Python learner's pure parts (python/dloco_learner): the handshake's hashes and
typed settings, the fragment layout, the payload codecs, the config reader and the data streams' layout. The golden
values were produced by the C++ side (the syncer's `listening` event, src/core/fragments.cc) and are also checked end
to end by python_learner_test.py, where a wrong one is a refused join. Usage: PYTHONPATH=python python3 units_test.py.
"""
import math
import os
import struct
import tempfile
import unittest
from pathlib import Path

import numpy as np

from dloco_learner import codec, config, data, handshake, layout

TINY_TOML = """[model]\npreset = "tiny"\nvocab_size = 400\nd_model = 32\n[train]\nbatch_size = 8\ntotal_tokens = 76800
lr = 3e-3\nwarmup_steps = 5\n[diloco]\nmode = "decoupled"\nlearners = 2\ninner_steps = 4\nfragments = 4\noverlap = 1
quorum = 2\n"""


def tiny_config(text=TINY_TOML, overrides=()):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cfg.toml"
        path.write_text(text)
        return config.load_config(path, overrides)


class SteadyComputeTest(unittest.TestCase):
    def test_the_cpp_table(self):
        # tests/core/config_test.cc Slowdown.StretchesTheSteadyComputeNotASpike, value for value
        steady = config.SteadyCompute(3)
        for step_s, base in [(0.5, 0.0), (0.10, 0.10), (0.11, 0.11), (0.90, 0.11), (0.12, 0.11), (0.95, 0.12),
                             (0.96, 0.90), (0.97, 0.95)]:
            self.assertEqual(steady(step_s), base, step_s)


class HashesTest(unittest.TestCase):
    def test_fnv1a64_reference_vectors(self):
        self.assertEqual(handshake.fnv1a64(b""), 0xcbf29ce484222325)
        self.assertEqual(handshake.fnv1a64(b"a"), 0xaf63dc4c8601ec8c)
        self.assertEqual(handshake.fnv1a64(b"foobar"), 0x85944171f73967e8)
        self.assertEqual(handshake.fnv1a64_hex(np.zeros(0, np.float32)), "cbf29ce484222325")

    def test_handshake_settings_of_the_tiny_run(self):
        cfg = tiny_config()
        typed = {name: (kind, value) for name, kind, value in handshake.settings(cfg)}
        self.assertEqual(len(typed), len(handshake.settings(cfg)))  # no name twice
        # Typed as the C++ fields are: a double stays a double though whole, an integer an integer, choices strings.
        self.assertEqual(typed["model.d_model"], ("int", 32))
        self.assertEqual(typed["model.rope_theta"], ("double", 10000.0))
        self.assertEqual(typed["model.preset"], ("string", "tiny"))
        self.assertEqual(typed["model.tie_embeddings"], ("bool", True))
        self.assertEqual(typed["diloco.screen_ratio"], ("double", 10.0))
        self.assertEqual(typed["diloco.merge"], ("string", "rda"))
        self.assertEqual(typed["train.lr"], ("double", 3e-3))
        self.assertEqual(typed["data.streams"], ("int", 0))
        self.assertEqual(typed["data.order"], ("string", "contiguous"))
        for local in handshake.ROLE_LOCAL_TRAIN_KEYS:
            self.assertNotIn("train." + local, typed)
        self.assertFalse(any(name.startswith("run.") for name in typed))
        self.assertEqual(sum(name.startswith("model.") for name in typed), 11)


class LayoutTest(unittest.TestCase):
    def tiny_specs(self):
        from dloco_learner.model import GPT
        return [(n, tuple(p.shape)) for n, p in GPT(tiny_config()["model"]).named_parameters()]

    def test_the_tiny_models_layout_hash_is_the_cpp_one(self):
        self.assertEqual(layout.make_layout(self.tiny_specs(), 4).hash, 0x68495dc909d5f9c4)

    def test_every_element_in_exactly_one_fragment_and_lpt_balance(self):
        specs = self.tiny_specs()
        for P in (1, 2, 3, 4, 7, 16):
            lay = layout.make_layout(specs, P)
            covered = {}
            for f in lay.fragments:
                self.assertEqual(f.numel, sum(b.numel for b in f.blocks))
                for b in f.blocks:
                    covered.setdefault(b.tensor, []).append((b.offset, b.offset + b.numel))
            for i, (_, shape) in enumerate(lay.tensors):
                ranges = sorted(covered[i])
                self.assertEqual(ranges[0][0], 0)
                self.assertEqual(ranges[-1][1], int(np.prod(shape)))
                self.assertTrue(all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])))
            # Greedy list scheduling: the heaviest fragment got its last block while it was the lightest (≤ total/P).
            largest = max(b.numel for f in lay.fragments for b in f.blocks)
            self.assertLessEqual(max(f.numel for f in lay.fragments), lay.total_numel / P + largest)

    def test_more_fragments_than_blocks_is_refused(self):
        with self.assertRaises(ValueError):
            layout.make_layout([("a", (1,)), ("b", (1,))], 3)


class CodecTest(unittest.TestCase):
    def test_round_trip_within_the_bound_for_every_size(self):
        rng = np.random.default_rng(1)
        for name in ("fp32", "bf16", "q8", "q4"):
            for n in (0, 1, 2, 63, 64, 65, 255, 256, 257, 1000):
                x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
                wire, data = codec.encode(x, name)
                block = codec.DEFAULT_BLOCK.get(name, 0)
                self.assertEqual(len(data), codec.encoded_bytes(name, n, block), (name, n))
                y = codec.decode(wire, data, n)
                if name == "fp32":
                    np.testing.assert_array_equal(x, y)
                elif name == "bf16":
                    self.assertTrue(np.all(np.abs(x - y) <= np.abs(x) * 2.0 ** -8))
                else:
                    for lo in range(0, n, block):
                        m = np.abs(x[lo:lo + block]).max()
                        bound = m / (2 * codec.Q_MAX[name]) * (1 + 1e-5)
                        self.assertTrue(np.all(np.abs(x[lo:lo + block] - y[lo:lo + block]) <= bound), (name, n, lo))

    def test_q4_wire_layout(self):
        wire, data = codec.encode(np.array([7, -7, 1], np.float32), "q4")
        self.assertEqual(wire, "q4/64")
        self.assertEqual(data, struct.pack("<Qf", 3, 1.0) + bytes([0x97, 0x01]))  # value 2i in the low nibble

    def test_topk_wire_layout_and_round_trip(self):
        # The layout of src/transport/sparse_codec.h, pinned by the same bytes in tests/transport/sparse_codec_test.cc.
        wire, data = codec.encode(np.array([0.5, -2.0, 0.1, 1.0], np.float32), "topk", 64)
        self.assertEqual(wire, "topk/64")
        self.assertEqual(data, struct.pack("<QffH", 4, 2.0, 2.0, 1) + bytes([0x03]))
        np.testing.assert_array_equal(codec.decode(wire, data, 4), np.array([0, -2, 0, 0], np.float32))
        rng = np.random.default_rng(3)
        for n in (0, 1, 63, 64, 65, 4096, 10000):
            x = (rng.standard_normal(n) * 1e-3).astype(np.float32)
            wire, data = codec.encode(x, "topk")
            self.assertEqual(len(data), codec.sparse_bytes(n), n)
            y = codec.decode(wire, data, n)
            for lo in range(0, n, codec.SPARSE_CHUNK):
                seg, out = x[lo:lo + codec.SPARSE_CHUNK], y[lo:lo + codec.SPARSE_CHUNK]
                kept = out != 0
                self.assertEqual(int(kept.sum()), (seg.size + 63) // 64)
                self.assertTrue(np.all(np.abs(seg[~kept]) <= np.abs(seg[kept]).min()))
                self.assertTrue(np.all(np.signbit(out[kept]) == np.signbit(seg[kept])))
        for bad in [data[:-1], data[:8] + struct.pack("<f", -1.0) + data[12:]]:
            with self.assertRaises(codec.CodecError):
                codec.decode(wire, bad, 10000)
        with self.assertRaises(codec.CodecError):
            codec.decode("topk/32", data, 10000)

    def test_topk_with_another_density(self):
        # One in 2 kept: the bytes of tests/transport/sparse_codec_test.cc WritesTheDocumentedLayout.
        wire, data = codec.encode(np.array([0.5, -2.0, 0.1, 1.0], np.float32), "topk", 64, 2)
        self.assertEqual(wire, "topk/64/2")
        self.assertEqual(data, struct.pack("<QffHH", 4, 1.0, 2.0, 1, 3) + bytes([0x03]))
        np.testing.assert_array_equal(codec.decode(wire, data, 4), np.array([0, -1.75, 0, 1.25], np.float32))
        x = (np.random.default_rng(5).standard_normal(10000) * 1e-3).astype(np.float32)
        wire, data = codec.encode(x, "topk", 0, 16)
        self.assertEqual((wire, len(data)), ("topk/4096/16", codec.sparse_bytes(10000, 4096, 16)))
        y = codec.decode(wire, data, 10000)
        self.assertEqual(int((y[:4096] != 0).sum()), 256)
        for bad in ("topk/4096/1", "topk/4096/016", "topk/4096/2048", "topk/4096/16/2", "topk/4096/8", "topk/4096/64"):
            with self.assertRaises(codec.CodecError):
                codec.decode(bad, data, 10000)
        with self.assertRaises(codec.CodecError):
            codec.encode(x, "topk", 0, 1)
        feedback = codec.ErrorFeedback(0.95, 16)  # what OuterSync builds from diloco.topk_density
        self.assertEqual(feedback.encode(x, "topk")[0], "topk/4096/16")
        self.assertEqual(codec.ErrorFeedback(0.95).encode(x, "topk")[0], "topk/4096")

    def test_bf16_rounds_to_nearest_even(self):
        bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F800000, 0x7F7FFFFF, 0x7FC00001, 0xFFA00000],
                        np.uint32).view(np.float32)
        self.assertEqual(codec.float_to_bf16(bits).tolist(), [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7F80, 0x7FC0, 0xFFE0])

    def test_malformed_payloads_are_refused(self):
        _, q8 = codec.encode(np.ones(3, np.float32), "q8")
        _, q4 = codec.encode(np.ones(3, np.float32), "q4")
        for wire, data, n in [("q8/0", q8, 3), ("q8/70000", q8, 3), ("int8", q8, 3), ("q8/256", q8[:-1], 3),
                              ("q8/256", q8, 4), ("q8/256", q8[:-1] + b"\x80", 3),
                              ("q4/64", q4[:-1] + b"\x81", 3), ("q4/64", q4[:-2] + b"\x08\x00", 3),
                              ("q8/256", q8[:8] + struct.pack("<f", -1.0) + q8[12:], 3),
                              ("q8/256", q8[:8] + struct.pack("<f", math.nan) + q8[12:], 3),
                              ("fp32", b"\x00" * 5, -1), ("bf16", b"\x00" * 4, 3)]:
            with self.assertRaises(codec.CodecError, msg=(wire, data)):
                codec.decode(wire, data, n)
        with self.assertRaises(codec.CodecError):
            codec.encode(np.array([1, math.inf], np.float32), "q8")
        with self.assertRaises(codec.CodecError):
            codec.apply_update(np.array([3e38], np.float32), *codec.encode(np.array([3e38], np.float32), "q8"))

    def test_error_feedback_keeps_the_sum_within_one_rounding(self):
        rng = np.random.default_rng(2)
        fb, sent, total = codec.ErrorFeedback(), np.zeros(100, np.float64), np.zeros(100, np.float64)
        for _ in range(50):
            x = rng.standard_normal(100).astype(np.float32) * 0.01
            wire, data = fb.encode(x, "q4")
            sent += codec.decode(wire, data, 100)
            total += x
        self.assertLessEqual(np.abs(total - sent).max(), np.abs(fb.residual).max() + 1e-6)
        self.assertLess(np.abs(total - sent).max(), 0.02)


class ConfigTest(unittest.TestCase):
    def test_preset_then_keys_then_overrides(self):
        cfg = tiny_config(overrides=["train.lr=1e-3", "run.name=demo"])
        self.assertEqual((cfg["model"]["vocab_size"], cfg["model"]["seq_len"], cfg["model"]["d_model"]), (400, 32, 32))
        self.assertEqual(cfg["train"]["lr"], 1e-3)
        self.assertEqual(cfg["run"]["name"], "demo")
        self.assertIsInstance(cfg["diloco"]["screen_ratio"], float)
        self.assertTrue(os.path.isabs(cfg["data"]["dir"]))

    def test_types_as_the_cpp_reader_takes_them(self):
        cfg = tiny_config(TINY_TOML + "[run]\nseed = 7.0\nreport_interval_s = 2\n")
        self.assertEqual((cfg["run"]["seed"], cfg["run"]["report_interval_s"]), (7, 2.0))
        self.assertIsInstance(cfg["run"]["report_interval_s"], float)
        for bad, key in [("[train]\nbatch_size = 2.5\n", "train.batch_size"), ("[train]\nlr = \"x\"\n", "train.lr"),
                         ("[train]\nlearning_rate = 1\n", "learning_rate"), ("[nope]\n", "[nope]"),
                         ("[diloco]\nwire_up = \"int3\"\n", "diloco.wire_up"),
                         ("[model]\npreset = \"huge\"\n", "huge")]:
            with self.assertRaises(config.ConfigError) as e:
                tiny_config(bad)
            self.assertIn(key, str(e.exception))

    def test_unsupported_setups_are_refused_with_the_reason(self):
        for text, words in [('[diloco]\nmode = "dp"\n', "decoupled runs only"), ("[parallel]\ntensor = 2\n", "group"),
                            ("[diloco]\nblocking = true\n", "blocking")]:
            with self.assertRaises(config.ConfigError) as e:
                config.check_supported(tiny_config(text), 1)
            self.assertIn(words, str(e.exception))


class _CountingSplit:
    """A split whose token i is i (what DataStream reads of it: size and copy)."""
    size = 10000

    def copy(self, begin, count):
        return list(range(begin, begin + count))


class DataStreamTest(unittest.TestCase):
    def stream(self, order, index=2, count=3, cursor=None):
        return data.DataStream(_CountingSplit(), index, count, 2, 8,
                               cursor or {"stream": index, "position": 0, "epoch": 0, "tokens_served": 0}, order)

    def rows(self, s, batches):
        """The row slots (first token // T) of the next batches: 2 rows of 8 + 1 tokens each."""
        out = []
        for _ in range(batches):
            w = s.next()
            self.assertEqual(len(w), 2 * 9)
            out += [int(w[0]) // 8, int(w[9]) // 8]
        return out

    def test_shuffled_slots_are_the_cpp_ones(self):
        # tests/data/data_test.cc ShuffledSlotsArePinned: the same row slots from the C++ DataStream
        s = self.stream("shuffled")
        self.assertEqual(self.rows(s, 3), [1091, 1052, 650, 395, 602, 314])
        for _ in range(3, 208):
            s.next()
        self.assertEqual(self.rows(s, 2), [230, 1199, 266, 17])  # epoch 1
        self.assertEqual(s.cursor["epoch"], 1)

    def test_shuffled_stream_reads_each_of_its_row_slots_once_an_epoch(self):
        s = self.stream("shuffled")
        epoch0 = self.rows(s, 208)  # (10000 − 1) // 8 = 1249 row slots, every third: 416, 2 a batch
        self.assertEqual(s.cursor["epoch"], 1)
        self.assertEqual(sorted(epoch0), list(range(2, 1249, 3)))
        w = self.stream("shuffled").next()
        for row in range(2):  # each row is T + 1 consecutive tokens
            self.assertEqual(list(w[9 * row:9 * row + 9]), list(range(w[9 * row], w[9 * row] + 9)))
        epoch1 = self.rows(s, 208)
        self.assertEqual(sorted(epoch1), sorted(epoch0))
        self.assertNotEqual(epoch1, epoch0)

    def test_a_shuffled_epoch_leaves_out_the_slots_past_the_last_whole_batch(self):
        # 10000 tokens, T = 8: 1249 row slots, stream 0 of 2 owns 625; B = 3: 208 batches an epoch, 1 slot left out
        s = data.DataStream(_CountingSplit(), 0, 2, 3, 8, {"stream": 0, "position": 0, "epoch": 0, "tokens_served": 0},
                            "shuffled")
        rows = []
        for _ in range(208):
            w = s.next()
            rows += [int(w[r * 9]) // 8 for r in range(3)]
        self.assertEqual(s.cursor["epoch"], 1)
        self.assertEqual(len(set(rows)), 624)
        self.assertTrue(set(rows) < set(range(0, 1249, 2)))
        with self.assertRaises(config.ConfigError):  # fewer row slots than rows in a batch
            data.DataStream(_CountingSplit(), 0, 2, 700, 8, {"stream": 0, "position": 0, "epoch": 0,
                                                             "tokens_served": 0}, "shuffled")

    def test_contiguous_stream_reads_its_range_in_order(self):
        s = self.stream("contiguous")
        self.assertEqual([int(s.next()[0]) for _ in range(3)], [6666, 6682, 6698])
        w = s.next()  # rows of T + 1 that share a token: 6714 … 6722, 6722 … 6730
        self.assertEqual(list(w), list(range(6714, 6723)) + list(range(6722, 6731)))

    def test_a_foreign_cursor_is_refused(self):
        with self.assertRaises(config.ConfigError):
            self.stream("shuffled", cursor={"stream": 2, "position": 5, "epoch": 0, "tokens_served": 5})


if __name__ == "__main__":
    unittest.main(verbosity=2)
