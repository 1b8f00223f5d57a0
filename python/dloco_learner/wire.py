"""The learner's gRPC link to the syncer (docs/protocol.md §1, §7, §12; the C++ counterpart is src/learner/link.cc).

- Stubs: generated from proto/dloco.proto with protoc and /usr/bin/grpc_python_plugin on first use, into a cache
  folder named by the hash of the proto and protoc's version (nothing generated is committed: a changed proto or
  compiler makes new stubs, and the stubs always match the proto the C++ was built from).
- Every call carries `authorization: Bearer <secret>` and a deadline: Join 5 s, GetFragment 30 s (both wait for the
  connection within their deadline: gRPC's fail-fast calls let it abandon connection attempts). The Session
  stream lives as long as the run, so it has no deadline of its own: HTTP/2 keepalive pings (every 10 s, 5 s to
  answer) end it when the syncer stops answering, and the link then re-joins with a jittered backoff.
- The training thread calls post() and poll() only (a lock around a queue): it never waits on the network.

Retryable failures (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED and anything unexpected) are retried;
UNAUTHENTICATED, FAILED_PRECONDITION (a refused handshake) and INVALID_ARGUMENT are final (LinkRefused).
"""
import collections
import hashlib
import importlib
import ipaddress
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .config import ConfigError

PROTO_DEFAULT = Path(__file__).resolve().parents[2] / "proto" / "dloco.proto"
GRPC_PLUGIN = "/usr/bin/grpc_python_plugin"
JOIN_DEADLINE_S = 5.0
FRAGMENT_DEADLINE_S = 30.0
MAX_MESSAGE_BYTES = 1 << 30  # as the C++ channel: a pull answer carries a whole fragment


class LinkRefused(ConfigError):
    """The syncer refused this learner (secret, handshake, id): retrying cannot help."""


def load_stubs(proto_path=None):
    """(dloco_pb2, dloco_pb2_grpc) generated from the proto (DLOCO_PROTO or the repository's proto/dloco.proto),
    cached under $XDG_CACHE_HOME/dloco_learner/<sha256 of the proto and protoc's version>/ (a temporary folder when
    that is not writable). ConfigError when protoc or the plugin is missing or fails."""
    proto = Path(os.environ.get("DLOCO_PROTO") or proto_path or PROTO_DEFAULT)
    try:
        text = proto.read_bytes()
    except OSError:
        raise ConfigError("cannot read the protocol definition %s (set DLOCO_PROTO to proto/dloco.proto)" % proto) \
            from None
    try:  # stubs depend on the generator too: a new protoc makes new ones
        version = subprocess.run(["protoc", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = "?"
    key = hashlib.sha256(text + version.encode()).hexdigest()[:16]
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dloco_learner"
    target = cache_root / key
    if not (target / "dloco_pb2_grpc.py").exists():
        try:
            cache_root.mkdir(parents=True, exist_ok=True)
            parent = cache_root
        except OSError:
            parent = Path(tempfile.gettempdir())
            target = Path(tempfile.mkdtemp(prefix="dloco_stubs_"))
        _generate(proto, parent, target)
    sys.path.insert(0, str(target))
    return importlib.import_module("dloco_pb2"), importlib.import_module("dloco_pb2_grpc")


def _generate(proto, parent, target):
    protoc = shutil.which("protoc")
    if not protoc or not os.access(GRPC_PLUGIN, os.X_OK):
        raise ConfigError("generating the gRPC stubs needs protoc and %s: install Debian's protobuf-compiler and "
                          "protobuf-compiler-grpc (scripts/setup.sh)" % GRPC_PLUGIN)
    tmp = Path(tempfile.mkdtemp(prefix=".stubs_", dir=parent))
    cmd = [protoc, "-I", str(proto.parent), "--python_out", str(tmp), "--grpc_python_out", str(tmp),
           "--plugin=protoc-gen-grpc_python=" + GRPC_PLUGIN, proto.name]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise ConfigError("protoc did not finish within 60 s: %s" % " ".join(cmd)) from None
    if r.returncode != 0:
        raise ConfigError("protoc failed on %s: %s" % (proto, r.stderr.strip()[:2000]))
    if target.exists():  # another process made them meanwhile (or a temporary target)
        for f in tmp.iterdir():
            os.replace(f, target / f.name)
        tmp.rmdir()
    else:
        try:
            os.rename(tmp, target)
        except OSError:  # a concurrent process won the rename: its stubs are the same
            shutil.rmtree(tmp, ignore_errors=True)


def is_loopback(host):
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


class Backoff:
    """Jittered exponential backoff, 0.2 s doubling to 2 s, seeded per learner (learners must not retry in step)."""

    def __init__(self, seed, initial=0.2, maximum=2.0):
        self.rng, self.initial, self.maximum, self.delay = random.Random(seed), initial, maximum, initial

    def next(self):
        d = self.delay * (0.5 + self.rng.random())
        self.delay = min(self.maximum, self.delay * 2)
        return min(d, self.maximum)

    def reset(self):
        self.delay = self.initial


class SyncerLink:
    """Join, GetFragment and the Session stream of one learner."""

    def __init__(self, pb, pb_grpc, address, handshake, learner_id, host, seed, cfg):
        import grpc  # after the stubs exist: the generated module imports grpc too
        self.grpc, self.pb = grpc, pb
        self.address, self.handshake, self.learner_id, self.host = address, handshake, learner_id, host
        self.seed = seed
        run = cfg["run"]
        tls = bool(run["tls_ca"])
        if not tls and not run["insecure"] and not is_loopback(address.rsplit(":", 1)[0]):
            raise ConfigError("would send the run secret in clear text to '%s' (not loopback, no TLS): set "
                              "run.tls_cert, run.tls_key and run.tls_ca, or run.insecure = true on a trusted network"
                              % address)
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 2000), ("grpc.keepalive_time_ms", 10000),
                   ("grpc.keepalive_timeout_ms", 5000), ("grpc.keepalive_permit_without_calls", 1),
                   ("grpc.http2.max_pings_without_data", 0)]
        if tls:
            def read(path, field):
                try:
                    return Path(path).read_bytes()
                except OSError:
                    raise ConfigError("%s: cannot read '%s'" % (field, path)) from None
            creds = grpc.ssl_channel_credentials(
                root_certificates=read(run["tls_ca"], "run.tls_ca"),
                private_key=read(run["tls_key"], "run.tls_key") if run["tls_mutual"] else None,
                certificate_chain=read(run["tls_cert"], "run.tls_cert") if run["tls_mutual"] else None)
            self.channel = grpc.secure_channel(address, creds, options)
        else:
            self.channel = grpc.insecure_channel(address, options)
        self.stub = pb_grpc.SyncerStub(self.channel)
        self.metadata = (("authorization", "Bearer " + handshake.secret),) if handshake.secret else ()
        self.session_id = 0
        self.held_stream = -1
        self.busy_streams = {}  # stream -> when this learner found its log locked (told to the syncer for 10 s)
        self._mu = threading.Condition()
        self._outbox = collections.deque()
        self._inbox = collections.deque()
        self._fatal = ""
        self._running = False
        self._thread = None
        self._call = None
        self.reconnects = 0

    # ---- calls ----

    def try_join(self, timeout_s):
        """The JoinReply, retrying retryable failures with backoff for up to `timeout_s`. Raises LinkRefused on a
        final refusal; returns (None, last error) when the time is up."""
        grpc = self.grpc
        deadline = time.monotonic() + timeout_s
        backoff = Backoff(self.seed)
        last = "no attempt within the time"
        while time.monotonic() < deadline:
            now = time.monotonic()
            req = self.pb.JoinRequest(handshake=self.handshake, learner_id=self.learner_id, host=self.host,
                                      busy_streams=[s for s, t in self.busy_streams.items() if now - t < 10])
            if self.held_stream >= 0:
                req.holds_stream, req.held_stream = True, self.held_stream
            try:
                # wait_for_ready: a syncer that is (re)starting is joined as soon as it listens; failing fast
                # instead lets gRPC abandon its connection attempts and back off for seconds.
                reply = self.stub.Join(req, timeout=max(0.1, min(JOIN_DEADLINE_S, deadline - time.monotonic())),
                                       metadata=self.metadata, wait_for_ready=True)
                self.session_id = reply.session_id
                return reply, None
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION,
                                grpc.StatusCode.INVALID_ARGUMENT):
                    raise LinkRefused("the syncer at %s refused learner %d: %s" % (self.address, self.learner_id,
                                                                                    e.details())) from None
                last = "%s: %s" % (e.code().name, e.details())
            time.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))
        return None, last

    def fetch_fragment(self, p):
        """dloco.v1.Fragment p as the syncer holds it now (deadline 30 s); raises grpc.RpcError on failure."""
        req = self.pb.FragmentRequest(session_id=self.session_id, fragment=p)
        return self.stub.GetFragment(req, timeout=FRAGMENT_DEADLINE_S, metadata=self.metadata, wait_for_ready=True)

    # ---- the session (background threads) ----

    def start(self):
        self._running = True
        self._thread = threading.Thread(target=self._session_loop, name="session", daemon=True)
        self._thread.start()

    def post(self, body):
        """Queues a Metadata or PullAnswer for the syncer (non-blocking); only the newest queued metadata is kept."""
        with self._mu:
            if isinstance(body, self.pb.Metadata) and self._outbox and isinstance(self._outbox[-1], self.pb.Metadata):
                self._outbox[-1] = body
            else:
                self._outbox.append(body)
            self._mu.notify_all()

    def poll(self):
        """Every SyncerMessage that arrived since the last poll (non-blocking)."""
        with self._mu:
            out = list(self._inbox)
            self._inbox.clear()
        return out

    def resync(self):
        """Ends the current session: the link re-joins and opens a new one, whose first merge of each fragment comes
        whole (a learner that cannot rebuild an update asks for this)."""
        call = self._call
        if call is not None:
            call.cancel()

    def fatal_error(self):
        with self._mu:
            return self._fatal

    def drain(self, timeout_s):
        """Waits up to `timeout_s` until the queued messages were handed to the session."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._mu:
                if not self._outbox:
                    return True
            time.sleep(0.01)
        return False

    def stop(self):
        self._running = False
        self.resync()
        with self._mu:
            self._mu.notify_all()
        if self._thread:
            self._thread.join(timeout=10)
        self.channel.close()

    def _requests(self, hello, broken):
        """The session's request stream: the hello, then the outbox, until the session breaks or the link stops."""
        yield self.pb.LearnerMessage(session_id=self.session_id, metadata=hello)
        while True:
            with self._mu:
                while self._running and not broken.is_set() and not self._outbox:
                    self._mu.wait(0.1)
                if not self._running or broken.is_set():
                    return
                body = self._outbox.popleft()
            if isinstance(body, self.pb.Metadata):
                yield self.pb.LearnerMessage(session_id=self.session_id, metadata=body)
            else:
                yield self.pb.LearnerMessage(session_id=self.session_id, answer=body)

    def _session_loop(self):
        backoff = Backoff(self.seed + 1)
        first = True
        while self._running:
            if not first:
                time.sleep(backoff.next())
                if not self._running:
                    break
                try:
                    reply, _ = self.try_join(5.0)
                except LinkRefused as e:  # e.g. the syncer came back with another layout: training must stop
                    with self._mu:
                        self._fatal = str(e)
                    self._running = False
                    break
                if reply is None:
                    continue  # still unreachable: keep training, try again after the backoff
                self.reconnects += 1
            first = False
            with self._mu:  # the session's first message names it: the newest metadata queued, else an empty one
                hello = next((m for m in reversed(self._outbox) if isinstance(m, self.pb.Metadata)), None)
            hello = self.pb.Metadata() if hello is None else hello
            broken = threading.Event()
            try:
                self._call = self.stub.Session(self._requests(hello, broken), metadata=self.metadata)
                for message in self._call:
                    backoff.reset()
                    with self._mu:
                        self._inbox.append(message)
            except self.grpc.RpcError:
                pass  # the session broke (or resync() ended it): re-join and open the next one
            finally:
                broken.set()
                self._call = None
