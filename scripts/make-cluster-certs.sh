#!/usr/bin/env bash
# Makes a cluster credential for [cluster] tls_certificate / tls_key / tls_ca_file: a cluster CA
# (OUTDIR/ca.pem, ca.key; reused when present) and, per NODE name, a certificate it signed
# (OUTDIR/NODE.pem, NODE.key). Every node of a cluster gets its own certificate of the one CA;
# the shell takes any of them (--tls-cert, --tls-key, --tls-ca). Keys are unencrypted files:
# keep OUTDIR readable by the node's user only.
#   scripts/make-cluster-certs.sh config/local-tls/certs gateway engine-a engine-b shell
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUTDIR NODE..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out"
chmod 700 "$out"
days=${SHOAL_CERT_DAYS:-825}
if [ ! -f "$out/ca.pem" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" -subj "/CN=shoal cluster CA" \
    -keyout "$out/ca.key" -out "$out/ca.pem" 2>/dev/null
fi
for node in "$@"; do
  openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$node" \
    -keyout "$out/$node.key" -out "$out/$node.csr" 2>/dev/null
  openssl x509 -req -in "$out/$node.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
    -days "$days" -sha256 -out "$out/$node.pem" 2>/dev/null
  rm -f "$out/$node.csr"
  chmod 600 "$out/$node.key"
done
chmod 600 "$out/ca.key"
echo "cluster CA $out/ca.pem; certificates: $(printf '%s.pem ' "$@")"
