"""python3 -m dloco_learner --config RUN/config.toml --syncer HOST:PORT --id N [--run-dir DIR] [--set K=V]…

The same arguments as `dloco learner` (README "Running on several machines by hand"). Exit status 0 at the end of
the run (or after a graceful leave on SIGTERM/SIGINT), 2 on bad input or a refusal, with the reason on stderr.
"""
import argparse
import sys

from .learner import main_entry


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m dloco_learner",
                                     description="A Python learner of a dloco decoupled run (docs/protocol.md).")
    parser.add_argument("--config", required=True, help="the run's TOML config (the same as the syncer's)")
    parser.add_argument("--syncer", required=True, help="the syncer's address host:port")
    parser.add_argument("--id", type=int, required=True, help="learner id: 0 ≤ id < M for a slot, any other id "
                        "below 65536 joins a running job when a data stream is free")
    parser.add_argument("--run-dir", default=None, help="folder for its events and stream log (default: "
                        "run.out_dir/run.name)")
    parser.add_argument("--set", action="append", default=[], metavar="K=V",
                        help="override a config field, e.g. run.threads=1 (repeatable)")
    parser.add_argument("--insecure", action="store_true", help="allow dialling a syncer off loopback without TLS")
    parser.add_argument("--bootstrap-timeout", type=float, default=120.0, metavar="S",
                        help="give up when the syncer cannot be joined within S seconds (default 120)")
    args = parser.parse_args(argv)
    if args.insecure:
        args.set.append("run.insecure=true")
    return main_entry(args)


if __name__ == "__main__":
    sys.exit(main())
