# The arbiter's ExecCondition= of an engine (../fleet.nix): exit 0, and the engine starts, only
# when the training unit is inactive or failed; exit 1 (systemd skips the start, the engine is
# not failed) while it is activating, active, reloading or deactivating. Its OnSuccess= and
# OnFailure= start the engine once it is inactive or failed. A plain function of strings, so
# the tests run it with a stand-in for systemctl.
{
  systemctl,
  engine,
  unit,
}:
''
  state=$(${systemctl} show --property=ActiveState --value '${unit}.service')
  case "$state" in
    inactive|failed) exit 0 ;;
  esac
  echo "${engine}.service stays stopped while ${unit}.service is $state (llmBench.arbiter)"
  exit 1
''
