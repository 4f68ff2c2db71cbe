# The script of llmBench.watch (../watch.nix): a plain function of strings, so the tests run it
# with stand-ins for llm-bench, systemctl, curl and the marker.
#
#   --on-change  after a switch or at boot: measure only when the marker differs from the one
#                last measured (its sha256 in DIRECTORY/.engine)
#   --always     on the timer: measure whatever changed
#
# A unit the router gives way to (the arbiter's training) being active writes a skip record per
# preset instead. The measurement is bounded by `timeout`; when it is cut short, the presets are
# unloaded through the router's own API, so no model stays loaded. Then `llm-bench history`
# reads the folder (pruning all but the newest `keep` per configuration); its exit code 4 means
# the newest step is a regression, and the unit fails with its message in the journal.
{
  lib,
  llmBench,
  url,
  presets,
  directory,
  runs,
  maxTokens,
  keep,
  timeLimitSec,
  givesWayTo,
  systemctl,
  sha256sum,
  curl,
  marker,
}:

let
  q = lib.escapeShellArg;
  aliases = lib.concatMapStringsSep " " (p: "--alias ${q p}") presets;
  skipAll =
    reason:
    lib.concatMapStrings (p: ''
      ${llmBench} history --skipped ${reason} --alias ${q p} ${q directory}
    '') presets;
  unloadAll = lib.concatMapStrings (p: ''
    ${curl} --silent --show-error --max-time 30 -X POST -H 'Content-Type: application/json' \
      --data ${q (builtins.toJSON { model = p; })} ${q "${url}/models/unload"} >/dev/null || true
  '') presets;
in
''
  set -uo pipefail
  mode="''${1:---on-change}"
  mkdir -p ${q directory}
  engine="$(${sha256sum} ${q marker} | cut -d' ' -f1)"
  if [ "$mode" = --on-change ] && [ -e ${q "${directory}/.engine"} ] \
     && [ "$(cat ${q "${directory}/.engine"})" = "$engine" ]; then
    echo "llm-bench-watch: the engine is the one last measured (${marker} sha256 $engine); nothing to measure"
    exit 0
  fi
  ${lib.optionalString (presets == [ ]) ''
    echo "llm-bench-watch: this engine serves none of llmBench.watch.presets; nothing to measure"
    exit 0
  ''}
  for unit in ${lib.concatMapStringsSep " " q givesWayTo}; do
    if ${systemctl} is-active --quiet "$unit.service"; then
      echo "llm-bench-watch: $unit.service is active (the router gives way to it); recording a skip"
  ${skipAll ''"$unit.service is active: the router gives way to it (llmBench.arbiter)"''}
      exit 0
    fi
  done
  # The router listens some seconds after its unit started (at boot, after a switch).
  for _ in $(seq 120); do
    ${curl} --silent --fail --max-time 5 ${q "${url}/health"} >/dev/null && break
    sleep 1
  done
  run="${directory}/$(date -u +%Y%m%dT%H%M%SZ)"
  timeout ${toString timeLimitSec} ${llmBench} run --url ${q url} ${aliases} --runs ${toString runs} \
    --max-tokens ${toString maxTokens} --strict --unload --label watch --output-dir "$run"
  status=$?
  case "$status" in
    0|1) ;;  # measured (1: some presets failed; each is recorded with the server's message)
    124)
      echo "llm-bench-watch: stopped after ${toString timeLimitSec} s (llmBench.watch.timeLimitSec); unloading"
  ${unloadAll}
  ${skipAll ''"the measurement took longer than ${toString timeLimitSec} s (llmBench.watch.timeLimitSec)"''}
      ;;
    *)
      echo "llm-bench-watch: llm-bench run exited with $status; the engine will be measured on the next start"
      exit "$status"
      ;;
  esac
  echo "$engine" > ${q "${directory}/.engine"}
  exec ${llmBench} history --keep ${toString keep} ${q directory}
''
