#!/usr/bin/env bash
# Creates the Secret through which mci-apiserver in one cluster (the target)
# reaches another member of the ClusterSet: a Secret labelled
# mci.x-k8s.io/member-cluster=<name> whose key "kubeconfig" is a
# self-contained kubeconfig for the member (see
# artifacts/deploy/mci-apiserver/examples/member-secret.yaml).
#
# The kubeconfig authenticates as a least-privilege ServiceAccount of the
# member (by default mci-system/mci-member-reader, which
# artifacts/deploy/mci-apiserver/25-member-reader.yaml and the chart create,
# bound to mci-member-summary-reader: the two summaries, and get on the
# kube-system Namespace, whose uid is the cluster's ID)
# with a token the member's TokenRequest API mints for --token-duration
# (default 168h, one week). Your own credentials are used to mint it and
# never copied. The token expires: run the script again before it does
# (docs/membership.md, "Rotating a member's token"); mci-apiserver follows
# the changed Secret without a restart. The token goes from kubectl to a
# file readable by you only and into the Secret by standard input, never on
# a command line.
#
# Usage:
#   hack/create-member-secret.sh --context cluster-b --target-context cluster-a
#   hack/create-member-secret.sh --context cluster-b --dry-run > secret.yaml
#
# Options:
#   --context CTX            the member's context in --kubeconfig (required)
#   --kubeconfig FILE        kubeconfig holding --context (default: kubectl's)
#   --cluster-name NAME      the member's name in the ClusterSet (default: CTX)
#   --token-for-service-account NS/NAME
#                            the member's ServiceAccount the kubeconfig
#                            authenticates as (default
#                            mci-system/mci-member-reader)
#   --reader-cluster NAME    the target's name in the ClusterSet: the
#                            kubeconfig then authenticates as the member's
#                            per-reader ServiceAccount
#                            mci-system/mci-member-reader.NAME (the chart
#                            creates one per name in
#                            membership.memberReader.readers), by which the
#                            member sends NAME only the exports whose
#                            mci.x-k8s.io/export-to scope includes it; with
#                            the shared mci-member-reader, scoped exports
#                            reach no one (docs/api.md)
#   --token-duration DUR     lifetime of its token (default 168h; the
#                            member's apiserver may shorten it: the expiry it
#                            granted is printed)
#   --target-context CTX     context of the cluster whose mci-apiserver gets
#                            the member (default: kubectl's current context)
#   --target-kubeconfig FILE kubeconfig holding --target-context
#   --namespace NS           mci-apiserver's namespace (default mci-system)
#   --dry-run                print the Secret as YAML instead of applying it
set -o errexit -o nounset -o pipefail

usage() { sed -n '2,/^set -o/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }

context="" kubeconfig="" name="" service_account="" reader_cluster="" duration="168h"
target_context="" target_kubeconfig="" namespace="mci-system" dry_run=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --context) context="$2"; shift 2 ;;
    --kubeconfig) kubeconfig="$2"; shift 2 ;;
    --cluster-name) name="$2"; shift 2 ;;
    --token-for-service-account) service_account="$2"; shift 2 ;;
    --reader-cluster) reader_cluster="$2"; shift 2 ;;
    --token-duration) duration="$2"; shift 2 ;;
    --target-context) target_context="$2"; shift 2 ;;
    --target-kubeconfig) target_kubeconfig="$2"; shift 2 ;;
    --namespace) namespace="$2"; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
[[ -n "${context}" ]] || { echo "--context is required" >&2; usage; }
name="${name:-${context}}"
if [[ ! "${name}" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
  echo "cluster name ${name} is not a DNS label: pass --cluster-name" >&2
  exit 2
fi
if [[ -n "${reader_cluster}" ]]; then
  if [[ -n "${service_account}" ]]; then
    echo "--reader-cluster names the ServiceAccount already: leave out --token-for-service-account" >&2
    exit 2
  fi
  if [[ ! "${reader_cluster}" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
    echo "--reader-cluster ${reader_cluster} is not a DNS label" >&2
    exit 2
  fi
  service_account="mci-system/mci-member-reader.${reader_cluster}"
fi
service_account="${service_account:-mci-system/mci-member-reader}"
sa_namespace="${service_account%%/*}" sa_name="${service_account#*/}"
if [[ "${sa_namespace}" == "${service_account}" || -z "${sa_namespace}" || -z "${sa_name}" ]]; then
  echo "--token-for-service-account wants NAMESPACE/NAME, got ${service_account}" >&2
  exit 2
fi

member=(kubectl --context "${context}")
[[ -n "${kubeconfig}" ]] && member+=(--kubeconfig "${kubeconfig}")
target=(kubectl)
[[ -n "${target_kubeconfig}" ]] && target+=(--kubeconfig "${target_kubeconfig}")
[[ -n "${target_context}" ]] && target+=(--context "${target_context}")

# Everything written from here on is readable by you only.
umask 077
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
out="${tmp}/kubeconfig"

# Where the member is and how to verify it: the context's cluster entry,
# flattened so that a CA file is inlined. mci-apiserver accepts verified
# TLS only.
field() { "${member[@]}" config view --raw --flatten --minify -o "jsonpath={.clusters[0].cluster.$1}"; }
server="$(field server)"
ca="$(field certificate-authority-data)"
tls_server_name="$(field tls-server-name)"
insecure="$(field insecure-skip-tls-verify)"
if [[ "${server}" != https://* ]]; then
  echo "the server of context ${context} is not an https:// URL: mci-apiserver reaches members over verified TLS only" >&2
  exit 1
fi
if [[ "${insecure}" == true ]]; then
  echo "context ${context} skips TLS verification: give its cluster certificate-authority-data instead" >&2
  exit 1
fi
# These go into a YAML document as double-quoted strings.
unquotable='["\\[:cntrl:]]'
for value in "${server}" "${ca}" "${tls_server_name}"; do
  if [[ "${value}" =~ ${unquotable} ]]; then
    echo "the cluster entry of context ${context} holds a character this script does not quote" >&2
    exit 1
  fi
done

# The TokenRequest answer goes straight to a file: the token and the expiry
# the member granted, one a line.
"${member[@]}" create token "${sa_name}" --namespace "${sa_namespace}" --duration "${duration}" \
  -o 'jsonpath={.status.token}{"\n"}{.status.expirationTimestamp}{"\n"}' >"${tmp}/token"
{ IFS= read -r token && IFS= read -r expires; } <"${tmp}/token"
if [[ ! "${token}" =~ ^[A-Za-z0-9._-]+$ ]]; then
  echo "the member's TokenRequest API answered something that is not a token" >&2
  exit 1
fi

user="${sa_name}@${name}"
# printf is a shell builtin: the token reaches the file without a command
# line any other user could read.
{
  printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: "%s"\n  cluster:\n    server: "%s"\n' "${name}" "${server}"
  if [[ -n "${ca}" ]]; then printf '    certificate-authority-data: "%s"\n' "${ca}"; fi
  if [[ -n "${tls_server_name}" ]]; then printf '    tls-server-name: "%s"\n' "${tls_server_name}"; fi
  printf 'users:\n- name: "%s"\n  user:\n    token: "%s"\n' "${user}" "${token}"
  printf 'contexts:\n- name: "%s"\n  context:\n    cluster: "%s"\n    user: "%s"\ncurrent-context: "%s"\n' "${name}" "${name}" "${user}" "${name}"
} >"${out}"
unset token

# Built client-side from the file, so the kubeconfig never appears on a
# command line either.
secret="$(kubectl create secret generic "member-${name}" --namespace "${namespace}" \
  --from-file=kubeconfig="${out}" --dry-run=client -o yaml |
  kubectl label --local -f - "mci.x-k8s.io/member-cluster=${name}" -o yaml)"

echo "The token of ${service_account} in ${context} expires at ${expires}: run this again before then." >&2
if [[ "${dry_run}" == true ]]; then
  printf '%s\n' "${secret}"
  exit 0
fi
# Server-side apply: a client-side apply would copy the whole Secret,
# kubeconfig included, into the last-applied-configuration annotation.
printf '%s\n' "${secret}" |
  "${target[@]}" apply --server-side --field-manager=mci-create-member-secret -f -
