#!/usr/bin/env python3
"""Helm stand-in that records how it was called (standard library only).

Every call appends one JSON line to $HELM_RECORD: its argv, and for a `--values`/`-f`
file its path, mode, contents and the mode of the folder holding it, read while "Helm"
runs (the caller removes the file afterwards, which the test checks).

  version --short          prints $HELM_RECORDER_VERSION (default v3.14.4+g81c902a)
  install NAME ...         fails as Helm does when it has a release NAME already (in any
                           namespace: helm/helm v3.14.4 pkg/action/install.go, availableName:
                           "cannot re-use a name that is still in use"; Helm v4.1 words it
                           "cannot reuse ...", which tests/standin_tests/test_real_clients.py
                           meets with the real Helm); the releases it
                           has are those installed through this recorder ($HELM_RECORD.releases)
  history NAME ...         prints $HELM_RECORD.history/NAME.json, the release's revisions as
                           `helm history -o json` prints them (a test writes it), or fails
                           "release: not found" as Helm does
  install / upgrade NAME   while that history's newest revision is pending-*, fail as Helm does
                           (helm/helm v3.14.4 pkg/action/upgrade.go prepareUpgrade, errPending:
                           "another operation (install/upgrade/rollback) is in progress"; an
                           install first meets the name in use)
  uninstall NAME           forgets the release (its history and name)
  rollback NAME REV        adds a `deployed` revision after the newest, the others `superseded`
                           (pkg/action/rollback.go)
  anything else            prints a release summary and exits 0, unless
  $HELM_RECORDER_FAIL      is set: prints "Error: <its text>" on stderr and exits 1
  $HELM_RECORDER_SLEEP     seconds to sleep first (to exercise timeouts)
"""

import json
import os
import sys
import time


def values_file(argv):
    for i, arg in enumerate(argv):
        if arg in ("--values", "-f") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--values="):
            return arg.split("=", 1)[1]
    return None


def main():
    argv = sys.argv[1:]
    time.sleep(float(os.environ.get("HELM_RECORDER_SLEEP", "0")))
    entry = {"argv": argv}
    path = values_file(argv)
    if path:
        entry.update(values_file=path, values_mode=oct(os.stat(path).st_mode & 0o777),
                     values_dir_mode=oct(os.stat(os.path.dirname(path)).st_mode & 0o777),
                     values_text=open(path).read())
    record = os.environ.get("HELM_RECORD")
    if record:
        with open(record, "a") as handle:
            handle.write(json.dumps(entry) + "\n")
    if argv[:2] == ["version", "--short"]:
        print(os.environ.get("HELM_RECORDER_VERSION", "v3.14.4+g81c902a"))
        return 0
    failure = os.environ.get("HELM_RECORDER_FAIL")
    if failure:
        print(f"Error: {failure}", file=sys.stderr)
        return 1
    if record and argv[:1] in (["history"], ["uninstall"], ["rollback"]):
        return releases_command(record, argv)
    name = argv[1] if argv[:1] == ["install"] else argv[2] if argv[:2] == ["upgrade", "--install"] else None
    history = read_history(record, name) if name and record else None
    if history is not None and argv[0] == "upgrade" and history and history[-1]["status"].startswith("pending-"):
        print("Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress", file=sys.stderr)
        return 1
    if history is not None and argv[0] == "install":
        print("Error: INSTALLATION FAILED: cannot re-use a name that is still in use", file=sys.stderr)
        return 1
    if name and record:
        releases = record + ".releases"
        held = open(releases).read().split() if os.path.exists(releases) else []
        if argv[0] == "install" and name in held:
            print("Error: INSTALLATION FAILED: cannot re-use a name that is still in use", file=sys.stderr)
            return 1
        if name not in held:
            with open(releases, "a") as handle:
                handle.write(name + "\n")
    print(f'Release "{argv[2] if len(argv) > 2 else "?"}" has been upgraded. Happy Helming!')
    return 0


def history_path(record, name):
    return os.path.join(record + ".history", name + ".json")


def read_history(record, name):
    """The revisions, or for a file that is not JSON (a test's hostile history) one pending
    revision: `history` prints the file as it is all the same."""
    path = history_path(record, name)
    if not os.path.exists(path):
        return None
    try:
        return json.load(open(path))
    except (ValueError, RecursionError):
        return [{"revision": 1, "status": "pending-install"}]


def releases_command(record, argv):
    name = argv[1]
    history = read_history(record, name)
    if history is None:
        print("Error: release: not found", file=sys.stderr)
        return 1
    if argv[0] == "history":
        print(open(history_path(record, name)).read())
    elif argv[0] == "uninstall":
        os.remove(history_path(record, name))
        releases = record + ".releases"
        held = open(releases).read().split() if os.path.exists(releases) else []
        with open(releases, "w") as handle:
            handle.writelines(n + "\n" for n in held if n != name)
        print(f'release "{name}" uninstalled')
    else:
        history = [{**r, "status": "superseded"} if r["status"] == "deployed" else r for r in history]
        history.append({"revision": history[-1]["revision"] + 1, "status": "deployed",
                        "description": f"Rollback to {argv[2]}"})
        json.dump(history, open(history_path(record, name), "w"))
        print("Rollback was a success! Happy Helming!")
    return 0


if __name__ == "__main__":
    sys.exit(main())
