#!/usr/bin/env bash
# Creates the Secret through which mci-apiserver in one cluster (the target)
# reaches another member of the ClusterSet: a Secret labelled
# mci.x-k8s.io/member-cluster=<name> whose key "kubeconfig" is a
# self-contained kubeconfig for the member (see
# artifacts/deploy/mci-apiserver/examples/member-secret.yaml).
#
# The kubeconfig is taken from a context of your kubeconfig, minified to that
# one context and flattened (certificates inline). Those are YOUR credentials:
# prefer --token-for-service-account, which instead puts a token of a
# least-privilege ServiceAccount of the member (mci-system/mci-member-reader
# from artifacts/deploy/mci-apiserver/25-member-reader.yaml) in the Secret.
#
# Usage:
#   hack/create-member-secret.sh --context cluster-b --target-context cluster-a
#   hack/create-member-secret.sh --context cluster-b \
#     --token-for-service-account mci-system/mci-member-reader \
#     --target-context cluster-a
#   hack/create-member-secret.sh --context cluster-b --dry-run > secret.yaml
#
# Options:
#   --context CTX            the member's context in --kubeconfig (required)
#   --kubeconfig FILE        kubeconfig holding --context (default: kubectl's)
#   --cluster-name NAME      the member's name in the ClusterSet (default: CTX)
#   --token-for-service-account NS/NAME
#                            authenticate as this ServiceAccount of the member
#                            with a token from the TokenRequest API
#   --token-duration DUR     lifetime of that token (default 8760h; the
#                            member's apiserver may cap it)
#   --target-context CTX     context of the cluster whose mci-apiserver gets
#                            the member (default: kubectl's current context)
#   --target-kubeconfig FILE kubeconfig holding --target-context
#   --namespace NS           mci-apiserver's namespace (default mci-system)
#   --dry-run                print the Secret as YAML instead of applying it
set -o errexit -o nounset -o pipefail

usage() { sed -n '2,/^set -o/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }

context="" kubeconfig="" name="" service_account="" duration="8760h"
target_context="" target_kubeconfig="" namespace="mci-system" dry_run=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --context) context="$2"; shift 2 ;;
    --kubeconfig) kubeconfig="$2"; shift 2 ;;
    --cluster-name) name="$2"; shift 2 ;;
    --token-for-service-account) service_account="$2"; shift 2 ;;
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

member=(kubectl --context "${context}")
[[ -n "${kubeconfig}" ]] && member+=(--kubeconfig "${kubeconfig}")
target=(kubectl)
[[ -n "${target_kubeconfig}" ]] && target+=(--kubeconfig "${target_kubeconfig}")
[[ -n "${target_context}" ]] && target+=(--context "${target_context}")

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
chmod 700 "${tmp}"
out="${tmp}/kubeconfig"

if [[ -z "${service_account}" ]]; then
  # --raw: without it kubectl replaces the inline data by placeholders.
  "${member[@]}" config view --raw --flatten --minify >"${out}"
else
  sa_namespace="${service_account%%/*}" sa_name="${service_account#*/}"
  if [[ "${sa_namespace}" == "${service_account}" || -z "${sa_name}" ]]; then
    echo "--token-for-service-account wants NAMESPACE/NAME, got ${service_account}" >&2
    exit 2
  fi
  field() { "${member[@]}" config view --raw --flatten --minify -o "jsonpath={.clusters[0].cluster.$1}"; }
  server="$(field server)"
  ca="$(field certificate-authority-data)"
  tls_server_name="$(field tls-server-name)"
  token="$("${member[@]}" create token "${sa_name}" -n "${sa_namespace}" --duration "${duration}")"
  user="${sa_name}@${name}"
  k=(kubectl config --kubeconfig "${out}")
  "${k[@]}" set-cluster "${name}" --server "${server}" >/dev/null
  if [[ -n "${ca}" ]]; then
    "${k[@]}" set "clusters.${name}.certificate-authority-data" "${ca}" >/dev/null
  fi
  if [[ -n "${tls_server_name}" ]]; then
    "${k[@]}" set "clusters.${name}.tls-server-name" "${tls_server_name}" >/dev/null
  fi
  "${k[@]}" set-credentials "${user}" --token "${token}" >/dev/null
  "${k[@]}" set-context "${name}" --cluster "${name}" --user "${user}" >/dev/null
  "${k[@]}" use-context "${name}" >/dev/null
fi

# Built client-side, so the kubeconfig never appears on a command line.
secret="$(kubectl create secret generic "member-${name}" --namespace "${namespace}" \
  --from-file=kubeconfig="${out}" --dry-run=client -o yaml |
  kubectl label --local -f - "mci.x-k8s.io/member-cluster=${name}" -o yaml)"

if [[ "${dry_run}" == true ]]; then
  printf '%s\n' "${secret}"
  exit 0
fi
# Server-side apply: a client-side apply would copy the whole Secret,
# kubeconfig included, into the last-applied-configuration annotation.
printf '%s\n' "${secret}" |
  "${target[@]}" apply --server-side --field-manager=mci-create-member-secret -f -
