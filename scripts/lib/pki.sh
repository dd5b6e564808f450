# shellcheck shell=bash
# The certificates and kubeconfigs of a local control plane, for the scripts that start one
# (scripts/k8s-cluster.sh, scripts/kube-scale.sh): one CA, P-256 keys, TLS everywhere, as
# kubeadm lays it out. Sourced, not run. Every function writes into the directory in $PKI.

# pki_ca CN DAYS: the CA ($PKI/ca.key, $PKI/ca.crt).
pki_ca() {
  local cn=$1 days=$2
  mkdir -p "$PKI"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=$cn" -days "$days" -out "$PKI/ca.crt" 2>/dev/null
}

# pki_cert DAYS NAME CN ORG SANS USAGE: $PKI/NAME.{key,crt}, signed by the CA. ORG may be
# empty (it becomes the subject's O, which Kubernetes reads as the group); SANS is a comma
# list of DNS:/IP: entries or empty; USAGE is server, client or both.
pki_cert() {
  local days=$1 name=$2 cn=$3 org=$4 sans=$5 usage=$6 ext subj
  ext=$(mktemp)
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    case "$usage" in
      server) echo "extendedKeyUsage=serverAuth" ;;
      client) echo "extendedKeyUsage=clientAuth" ;;
      both) echo "extendedKeyUsage=serverAuth,clientAuth" ;;
      *) echo "pki_cert: usage '$usage' is none of server, client, both" >&2; rm -f "$ext"; return 1 ;;
    esac
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$ext"
  subj="/CN=$cn"
  [ -n "$org" ] && subj="/O=$org$subj"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days "$days" -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$ext" "$PKI/$name.csr"
}

# pki_kubeconfig FILE CLUSTER CERTNAME SERVER: a kubeconfig for SERVER that trusts the CA and
# presents $PKI/CERTNAME.{crt,key}.
pki_kubeconfig() {
  pki_kubeconfig_for "$1" "$2" "$4" "{client-certificate: $PKI/$3.crt, client-key: $PKI/$3.key}"
}

# pki_kubeconfig_token FILE CLUSTER TOKEN SERVER: the same for a bearer token (a service
# account's, from the TokenRequest API), as a pod's in-cluster identity authenticates.
pki_kubeconfig_token() {
  pki_kubeconfig_for "$1" "$2" "$4" "{token: $3}"
}

# pki_kubeconfig_for FILE CLUSTER SERVER USER: the kubeconfig both write; USER is the user
# entry as a YAML flow mapping.
pki_kubeconfig_for() {
  cat >"$1" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: $2
  cluster: {certificate-authority: $PKI/ca.crt, server: "$3"}
users:
- name: u
  user: $4
contexts:
- name: $2
  context: {cluster: $2, user: u}
current-context: $2
KUBECONFIG
}
