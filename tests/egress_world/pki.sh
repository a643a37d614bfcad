#!/bin/sh
# A test CA and one certificate per server of the egress world
# (tests/egress_names.rs), made with openssl in $1. Each certificate lists
# the names the tests aim at its address, the ones they expect the gateway
# to refuse included: a refused connection must fail because of the
# gateway, never because of a name missing from the certificate.
#   ca.pem           the CA the tenants trust
#   sNN.pem, sNN.key the server at 93.184.215.NN
set -eu
cd "$1"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout ca.key -out ca.pem -days 2 -subj "/CN=egress world test CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
leaf() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$2" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
    -days 2 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}
leaf s10 "DNS:allowed.test,DNS:shared.test,DNS:other.test,DNS:alias.test,IP:93.184.215.10,IP:2001:db8::10"
leaf s11 "DNS:other.test,DNS:alias.test,DNS:allowed.test,IP:93.184.215.11"
leaf s12 "DNS:a.cdn.test,DNS:b.cdn.test,DNS:cdn.test,IP:93.184.215.12"
leaf s13 "DNS:git.test,IP:93.184.215.13"
leaf s53 "DNS:doh.test,IP:93.184.215.53"
chmod 644 ./*.pem
