#!/usr/bin/env bash
# Runs the conformance suite (conformance/, mci-conformance) against a local
# ClusterSet of three clusters, once per mode of mci-apiserver (`make
# test-conformance`):
#
#   full     --member-summaries=never: every mci-apiserver watches the other
#            members' objects
#   summary  --member-summaries=auto, and the member identity may read the
#            summaries only, so that no server can fall back to full mode
#
# Each mode gets a fresh ClusterSet in _output/conformance/<mode>/clusterset,
# a kubeconfig holding the contexts cluster-a, cluster-b, cluster-c
# (_output/conformance/<mode>/kubeconfig) and the suite's report.yaml and
# report.html beside them. The ClusterSet is stopped when the mode ends,
# failing or not; its logs stay.
#
#   CONFORMANCE_MODES    the modes to run (full summary)
#   CONFORMANCE_FLAGS    more flags for mci-conformance (--run=..., --poll-timeout=...)
#   VERSION              the implementation version the report names
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

MODES="${CONFORMANCE_MODES:-full summary}"
FLAGS="${CONFORMANCE_FLAGS:-}"
VERSION="${VERSION:-$(hack/version.sh | cut -d' ' -f1)}"
clusters=(cluster-a cluster-b cluster-c)
# The 410 Gone test needs a resourceVersion the server no longer holds, and
# a client gets one only by making more changes than the server's watch
# history keeps: the servers keep 200 changes here (20,000 by default), so
# that the test's 250 make one too old in seconds.
history=(--watch-history-size=200)
history_changes=(--watch-history-changes=250)
# The data path the Extended tests send requests through: model-server
# simulators behind mci-epp in cluster-a and cluster-c, mci-sidecar and the
# Envoy-like gateway in cluster-b (the data path of make run), on
# 127.0.110-112.x, which no other test uses. The simulators name the
# instance that served in X-Simulator-Instance as <cluster>/<pod>.
datapath_block=110
datapath_flags=(--datapath-url="http://127.0.$((datapath_block + 1)).1:8080" --datapath-context=cluster-b
  --datapath-import=demo/llm-pool --datapath-model=meta-llama/Llama-3.1-8B-Instruct
  --datapath-served-by-header=X-Simulator-Instance)

# Member labels, for the test of export scoping by label selector: the
# ClusterSet gives each member its labels on a member Secret that every
# mci-apiserver reads (in place of its member kubeconfig file), and the
# suite is told the same labels, since it reads no implementation's objects.
member_labels=(cluster-a:region=us,tier=gold cluster-b:region=eu,tier=gold cluster-c:region=us)
label_flags=()
for l in "${member_labels[@]}"; do label_flags+=(--member-labels="${l}"); done

go build -o "${OUTPUT_BIN}/clusterset" ./test/cmd/clusterset

failed=()
for mode in ${MODES}; do
  case "${mode}" in
    full) up_flags=(--member-summaries=never) ;;
    summary) up_flags=(--member-summaries=auto --summary-reader-only --reader-identities) ;;
    *) echo "test-conformance: unknown mode ${mode} (full, summary)" >&2; exit 2 ;;
  esac
  out="${REPO_ROOT}/_output/conformance/${mode}"
  rm -rf "${out}"
  mkdir -p "${out}"
  start=${SECONDS}
  echo "+++ ${mode} mode: starting a local ClusterSet in ${out}/clusterset" >&2
  status=0
  # errexit does not apply inside a subshell on the left of ||: every step
  # that can fail ends the subshell with its status itself.
  (
    trap '"${OUTPUT_BIN}/clusterset" down --dir="${out}/clusterset"' EXIT
    "${OUTPUT_BIN}/clusterset" up --names="$(IFS=,; echo "${clusters[*]}")" --dir="${out}/clusterset" \
      --mci-apiserver="${OUTPUT_BIN}/mci-apiserver" "${up_flags[@]}" "${history[@]}" "${label_flags[@]}" >"${out}/clusterset-up.log" || exit
    echo "+++ ${mode} mode: ClusterSet up after $((SECONDS - start))s; starting the data path" >&2
    datapath_start=${SECONDS}
    # --examples names an empty folder: the data path alone, none of the
    # examples, whose objects the suite has no business seeing.
    no_examples="${out}/no-examples"
    mkdir -p "${no_examples}"
    "${OUTPUT_BIN}/clusterset" apply-examples --dir="${out}/clusterset" --examples="${no_examples}" \
      --datapath --datapath-loopback-block="${datapath_block}" --datapath-bin-dir="${OUTPUT_BIN}" >"${out}/datapath-up.log" 2>&1 || exit
    echo "+++ ${mode} mode: data path up in $((SECONDS - datapath_start))s" >&2
    # A member leaves the local ClusterSet when its member kubeconfig is
    # taken out of the directories every mci-apiserver watches and its
    # member Secrets are deleted.
    membership_flags=(
      --member-leave-command="'${OUTPUT_BIN}/clusterset' leave --dir='${out}/clusterset' --member=\"\${MCI_CONFORMANCE_MEMBER}\""
      --member-join-command="'${OUTPUT_BIN}/clusterset' join --dir='${out}/clusterset' --member=\"\${MCI_CONFORMANCE_MEMBER}\"")
    kubeconfigs=()
    for c in "${clusters[@]}"; do kubeconfigs+=("${out}/clusterset/${c}.kubeconfig"); done
    # One kubeconfig with the three contexts, as a user would hand the
    # suite; without kubectl the suite reads the three files as KUBECONFIG does.
    kubeconfig="$(IFS=:; echo "${kubeconfigs[*]}")"
    if command -v kubectl >/dev/null; then
      KUBECONFIG="${kubeconfig}" kubectl config view --flatten >"${out}/kubeconfig" || exit
      kubeconfig="${out}/kubeconfig"
    fi
    echo "+++ ${mode} mode: running the suite" >&2
    suite_start=${SECONDS}
    # shellcheck disable=SC2086 # CONFORMANCE_FLAGS is a list of flags
    "${OUTPUT_BIN}/mci-conformance" --kubeconfig="${kubeconfig}" --contexts="$(IFS=,; echo "${clusters[*]}")" \
      --report-dir="${out}" --implementation-version="${VERSION} (${mode} mode)" "${history_changes[@]}" \
      "${datapath_flags[@]}" "${membership_flags[@]}" "${label_flags[@]}" ${FLAGS} || suite=$?
    echo "+++ ${mode} mode: the suite ran in $((SECONDS - suite_start))s" >&2
    exit "${suite:-0}"
  ) || status=$?
  echo "+++ ${mode} mode: $((SECONDS - start))s in all; report in ${out}/report.html" >&2
  if [[ ${status} -ne 0 ]]; then
    failed+=("${mode}")
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "test-conformance: the suite failed in: ${failed[*]} (logs in _output/conformance/<mode>/clusterset/logs)" >&2
  exit 1
fi
