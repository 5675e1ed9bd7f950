#!/usr/bin/env bash
# Fuzzes every Fuzz* target of pkg/ and cmd/, one target per `go test -fuzz`
# run (go test fuzzes one target at a time), package after package.
#
#   hack/fuzz.sh            every target for FUZZTIME (60s): make fuzz
#   hack/fuzz.sh --smoke    the targets whose input crosses a trust boundary
#                           for FUZZ_SMOKE_TIME (3s): make fuzz-smoke, in
#                           make test
#   hack/fuzz.sh --list     the targets, each with "smoke" or "trusted"
#
# FUZZ_MATCH=<regexp> keeps the targets whose name matches it.
#
# The targets are found in the source, so that a new one cannot be left
# out: every top-level `func FuzzXxx(f *testing.F)` of a *_test.go file.
# The rule that picks the smoke targets, in this one place: a target takes
# untrusted input (member objects, Secrets, kubeconfigs, EPP answers,
# request bodies, annotations, resourceVersions...) unless a line of its
# doc comment starts with "Trusted input:" and says whose input it is
# (the operator's flags or files). Untrusted is the default, so a new
# target is smoked until someone says why it need not be.
#
# A crash fails the run once every target has had its turn; go test has
# written the failing input to the package's testdata/fuzz/<target>/, and
# the summary prints that path and the command that replays it. An input
# counts only if it fails again when replayed on its own: Go's engine can
# fail a run at the -fuzztime deadline, or on a worker it judged hung,
# without an input that fails. Such a run is said in the summary and run
# once more; failing twice fails.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

mode=all
case "${1:-}" in
  "") ;;
  --smoke) mode=smoke ;;
  --list) mode=list ;;
  *) echo "usage: $0 [--smoke|--list]" >&2; exit 2 ;;
esac
fuzztime="${FUZZTIME:-60s}"
if [[ ${mode} == smoke ]]; then
  fuzztime="${FUZZ_SMOKE_TIME:-3s}"
fi
match="${FUZZ_MATCH:-.}"

# targets prints "<package dir> <target> <smoke|trusted>" for every fuzz
# target, sorted by package (each package's instrumented test binary is
# built once and reused by its targets from the build cache).
targets() {
  find pkg cmd -name '*_test.go' -not -path '*/testdata/*' -print0 | xargs -0 awk '
    FNR == 1 { doc = "" }
    /^\/\// { doc = doc "\n" $0; next }
    /^func Fuzz[A-Za-z0-9_]*\(/ {
      name = $2; sub(/\(.*/, "", name)
      dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
      print "./" dir, name, (doc ~ /\n\/\/ Trusted input:/ ? "trusted" : "smoke")
    }
    { doc = "" }
  ' | sort -k1,1 -k2,2
}

list="$(targets | awk -v m="${match}" '$2 ~ m')"
if [[ ${mode} == list ]]; then
  echo "${list}"
  exit 0
fi
if [[ ${mode} == smoke ]]; then
  skipped="$(awk '$3 == "trusted" { print $2 }' <<<"${list}" | paste -sd' ' -)"
  list="$(awk '$3 == "smoke"' <<<"${list}")"
  echo "fuzz-smoke: ${fuzztime} per target; not smoked (trusted input): ${skipped:-none}"
fi
if [[ -z "${list}" ]]; then
  echo "no fuzz targets match ${match}" >&2
  exit 1
fi

scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT
start=${SECONDS}
failed=()
summary=()
# fuzz_once runs one target for fuzztime into $out and sets status.
fuzz_once() {
  status=0
  # </dev/null: the loop's list is on stdin. The output is shown once the
  # run is judged (shown_as).
  go test -run '^$' -fuzz "^${target}\$" -fuzztime "${fuzztime}" "${dir}" </dev/null >"${out}" 2>&1 || status=$?
}

# shown_as prints the run in $out, each line after prefix: a first run
# retried for the engine's own failure is shown as such, so that its
# "--- FAIL" line is not counted as a test's failure by those who count
# them (.ci/run).
shown_as() {
  sed "s/^/${1}/" "${out}"
}

# failure_of prints why the run in $out failed: the input that fails, how
# to replay it, or "" when go test failed without naming an input it can
# replay (then the failure is the engine's own, not an input's).
failure_of() {
  # A new crash is written to testdata/fuzz; an input fuzzing kept from an
  # earlier run (in the build cache) that fails now is named only.
  local reproducer entry cached
  reproducer="$(sed -n 's/^ *Failing input written to //p' "${out}" | tail -1)"
  entry="$(sed -n 's/^failure while testing seed corpus entry: //p' "${out}" | tail -1)"
  if [[ -z "${reproducer}" && -n "${entry}" ]]; then
    if [[ -f "${dir}/testdata/fuzz/${entry}" ]]; then
      reproducer="testdata/fuzz/${entry}"
    else
      cached="$(find "$(go env GOCACHE)/fuzz" -path "*/${entry}" -print -quit 2>/dev/null || true)"
      echo "input ${cached:-${entry}} from an earlier run fails; copy it to ${dir#./}/testdata/fuzz/${target}/ and replay: go test -run '${entry}' ${dir}"
      return
    fi
  fi
  if [[ -z "${reproducer}" ]]; then
    return
  fi
  # Go's engine can report a worker that hit the -fuzztime deadline, or
  # that it judged hung, as a crash and write an input that passes when
  # replayed (golang/go#56238, #51484). An input counts only if it fails
  # again on its own.
  if go test -run "^${target}\$/^${reproducer##*/}\$" "${dir}" </dev/null >"${out}.replay" 2>&1; then
    echo "not reproduced: ${reproducer} passes when replayed" >"${out}.spurious"
    rm -f "${dir}/${reproducer}"
    return
  fi
  echo "reproducer ${dir#./}/${reproducer}; replay: go test -run '${target}/${reproducer##*/}' ${dir}"
}

while read -r dir target _; do
  echo "+++ ${target} in ${dir} for ${fuzztime}"
  out="${scratch}/${target}.log"
  t0=${SECONDS}
  fuzz_once
  note=""
  if [[ ${status} -ne 0 ]] && ! grep -q 'no fuzz tests to fuzz' "${out}"; then
    why="$(failure_of)"
    if [[ -z "${why}" ]]; then
      shown_as "first run, retried: "
      # Nothing that fails on its own: the engine's failure, said and
      # retried once; a second one fails the run.
      reason="$(grep -m1 -E 'context deadline exceeded|hung or terminated|terminated without fuzzing' "${out}" | sed 's/^ *//' || true)"
      [[ -f "${out}.spurious" ]] && reason="$(cat "${out}.spurious")"
      note=" (retried: the first run failed without an input that fails: ${reason:-see above})"
      echo "+++ ${target}: go test failed without an input that fails on its own (${reason:-see above}); once more"
      rm -f "${out}.spurious"
      fuzz_once
    fi
  fi
  shown_as ""
  # The last progress line says how many inputs were run; the seconds
  # include the build.
  execs="$(grep -o 'execs: [0-9]*' "${out}" | tail -1 | cut -d' ' -f2 || true)"
  line="$(printf '%-32s %-28s %10s execs %4ss' "${target}" "${dir}" "${execs:-0}" "$((SECONDS - t0))")"
  if [[ ${status} -eq 0 && -z "${execs}" ]]; then
    # Fuzzing starts by replaying the seeds and the inputs kept from
    # earlier runs; on a busy machine that can take the whole budget.
    # Said, not hidden.
    baseline="$(grep -o 'gathering baseline coverage: [0-9]*/[0-9]*' "${out}" | tail -1 | cut -d' ' -f4 || true)"
    line+=" (no new input tried: the time went to replaying its corpus, ${baseline:-?} done)"
  fi
  summary+=("${line}${note}")
  if grep -q 'no fuzz tests to fuzz' "${out}"; then
    echo "${target} in ${dir} is no fuzz target go test knows (a build constraint?)" >&2
    status=1
  fi
  if [[ ${status} -ne 0 ]]; then
    why="$(failure_of)"
    failed+=("${target} (${dir}): ${why:-go test failed twice without an input that fails on its own (the build, or the engine), see above}")
  fi
done <<<"${list}"

echo "--- fuzz ($(wc -l <<<"${list}") targets, ${fuzztime} each, $((SECONDS - start))s in all)"
printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  printf 'FAIL fuzz: %s\n' "${failed[@]}"
  exit 1
fi
