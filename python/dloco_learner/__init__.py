"""dloco_learner: a learner of a dloco decoupled run written in Python and PyTorch (issue 16 part 5).

It speaks the protocol of docs/protocol.md to the C++ syncer (proto/dloco.proto over gRPC), trains the same GPT as
the C++ learner (model.py), and ends holding the syncer's final Θ like any other learner. Modules, in the order a
run uses them: config (the run's TOML), handshake (the hashes the syncer checks), layout (fragments), wire (gRPC
link), data (shards, streams, stream log), model (GPT, AdamW, schedule), codec (payloads), outer_sync (answers and
merges), learner (the loop). Run it with `python3 -m dloco_learner` (python/README.md).
"""
