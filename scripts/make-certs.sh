#!/usr/bin/env bash
# A run's TLS material (docs/protocol.md §12), with the openssl command-line tool (scripts/setup.sh installs it):
# one CA, and one certificate per process name, each usable by a server (syncer, peer server, monitor) and as a
# client certificate under run.tls_mutual.
#
#   scripts/make-certs.sh DIR NAME[:HOST,HOST…] …
#   e.g. scripts/make-certs.sh certs syncer:10.0.0.1 learner0:10.0.0.2 learner1:gpu-node-7
#
# Writes DIR/ca.pem and DIR/ca.key (the CA: keep ca.key off the training machines), and for each NAME, NAME.pem and
# NAME.key. Each certificate names CN=NAME and is valid for DNS:NAME, DNS:localhost, IP:127.0.0.1 and every HOST given
# (an address as IP:, a name as DNS:); a client checks the host it dials against these, so list every address the
# process is dialled at. A CA already in DIR is reused: run it again to add a learner to a running job. EC P-256 keys,
# 825 days. Exit status 0 on success; 2 on bad arguments.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 DIR NAME[:HOST,HOST…] …   (e.g. $0 certs syncer:10.0.0.1 learner0:10.0.0.2)" >&2
  exit 2
fi
command -v openssl >/dev/null || { echo "$0: openssl is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
dir=$1
shift
mkdir -p "$dir"
umask 077
ext="" csr=""
trap 'rm -f "$ext" "$csr"' EXIT

if [[ -f "$dir/ca.key" && ! -f "$dir/ca.pem" ]] || [[ ! -f "$dir/ca.key" && -f "$dir/ca.pem" ]]; then
  echo "$0: $dir holds only one of ca.pem and ca.key: put the CA's other half back (a new CA would not be trusted by" \
       "the certificates already made), or use an empty folder" >&2
  exit 2
fi
if [[ ! -f "$dir/ca.key" ]]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ca.key" > /dev/null
  openssl req -x509 -new -key "$dir/ca.key" -subj "/CN=dloco run CA" -days 825 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$dir/ca.pem"
fi

for spec in "$@"; do
  name=${spec%%:*}
  hosts=""
  [[ "$spec" == *:* ]] && hosts=${spec#*:}
  if [[ ! "$name" =~ ^[A-Za-z0-9._-]+$ || "$name" == "ca" ]]; then
    echo "$0: '$name' is not a certificate name (letters, digits, '.', '_', '-'; not 'ca')" >&2
    exit 2
  fi
  san="DNS:$name,DNS:localhost,IP:127.0.0.1"
  list=()
  [[ -n "$hosts" ]] && IFS=',' read -r -a list <<< "$hosts"
  for h in "${list[@]+"${list[@]}"}"; do
    [[ -z "$h" ]] && continue
    if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san+=",IP:$h"; else san+=",DNS:$h"; fi
  done
  ext=$(mktemp)
  csr=$(mktemp)
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n%s\n' \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" > "$ext"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/$name.key" > /dev/null
  openssl req -new -key "$dir/$name.key" -subj "/CN=$name" -out "$csr"
  openssl x509 -req -in "$csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 825 -sha256 \
    -extfile "$ext" -out "$dir/$name.pem" 2> "$ext.log" || { cat "$ext.log" >&2; rm -f "$ext" "$ext.log" "$csr"; exit 1; }
  rm -f "$ext.log"
  rm -f "$ext" "$csr"
  chmod 644 "$dir/$name.pem"
  echo "$dir/$name.pem ($san), key $dir/$name.key"
done
chmod 644 "$dir/ca.pem"
