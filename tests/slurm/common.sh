# Sourced by the Slurm tests (slurm_test.sh, multinode_test.sh): what every test cluster and job shares. Expects
# $dir (the test's folder), $BUILD, and fail() defined by the caller.

# munge: its own key, socket and files in $dir (it refuses to run as root without --force); its pid in
# $dir/munged.pid.
start_munge() {
  mungekey --create --keyfile="$dir/munge.key" --force > /dev/null 2>&1 || fail "mungekey"
  chmod 600 "$dir/munge.key"
  munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --seed-file="$dir/munge.seed" --log-file="$dir/munged.log" || fail "munged did not start"
}

# The slurm.conf lines every test cluster shares: root runs everything, munge in $dir, state in $dir, no cgroups
# (a container may have none), no accounting.
slurm_conf_common() {
  cat <<CONF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CryptoType=crypto/munge
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
CONF
}

# A tiny corpus in $dir/data and $dir/tiny.toml: a decoupled run of M learners (as many as the job's tasks) for
# STEPS steps each, blocking (learners wait for each round's pull and merge): the tiny model's steps (~5 ms) are
# shorter than a merge's round trip, so without it how much of the learners' work reached Θ depended on timing
# (final loss 0.3–5.1 over runs, 1 in 5 above the unigram; CI failed on it once). With it the run ends at the same
# loss every time; the asynchronous modes have tests of their own. Usage: write_tiny_job M STEPS
write_tiny_job() {
  local M=$1 steps=$2
  for i in $(seq 3000); do echo "And it came to pass on day $((i % 97)) that the word was spoken."; done > "$dir/corpus.txt"
  "$BUILD/bin/dloco-data" prepare "$dir/corpus.txt" --out "$dir/data" --vocab-size 400 --threads 1 > "$dir/data.log" \
    2>&1 || fail "dloco-data prepare"
  cat > "$dir/tiny.toml" <<TOML
[model]
preset = "tiny"
vocab_size = 400
[data]
dir = "data"
[train]
batch_size = 8
total_tokens = $((M * steps * 8 * 32))
eval_interval = 50
eval_tokens = 4096
checkpoint_interval = 0
[diloco]
mode = "decoupled"
inner_steps = 4
fragments = 4
overlap = 1
quorum = $M
blocking = true
[run]
out_dir = "runs"
threads = 1
report_interval_s = 1.0
TOML
}
