"""`bootstrap kubeconfig INVENTORY [--merge] [--tunnel [--port N]]`: fetch the kubeconfig;
optionally merge it; optionally hold an SSH tunnel to the API open for kubectl, for VMs
whose provider opens only SSH."""

from __future__ import annotations

import argparse
import signal
import threading

from bootstrap.errors import BootstrapError, HostsFailed

SUMMARY = "fetch the cluster's kubeconfig (0600); --merge adds it to ~/.kube/config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tunnel", action="store_true",
                        help="hold an SSH tunnel to the API open for kubectl until Ctrl-C (when only SSH is open)")
    parser.add_argument("--port", type=int, default=6443, metavar="N",
                        help="with --tunnel: the local port (default 6443)")
    parser.add_argument("--merge", action="store_true",
                        help="add it to ~/.kube/config (or $KUBECONFIG) as context bootstrap-<cluster>")


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.cluster import kubeconfig_file
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.lock import cluster_lock
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "kubeconfig"):  # it may pin the server's host key
        path = kubeconfig_file.fetch_over_ssh(inventory, state)
    console.say(f"kubeconfig for cluster {inventory.cluster}: {path} "
                f"(context {kubeconfig_file.context_name(inventory)})")
    if args.merge and not args.tunnel:
        target = kubeconfig_file.default_target()
        kubeconfig_file.merge_into(target, kubeconfig_file.read_saved(path))
        console.say(f"merged into {target} as context {kubeconfig_file.context_name(inventory)}")
    if args.tunnel:
        hold_tunnel(inventory, state, path, args.port, args.merge, console)
    return 0


def hold_tunnel(inventory, state, path, port: int, merge: bool, console) -> None:
    """127.0.0.1:port -> the first server that answers, until Ctrl-C. k3s's serving
    certificate carries 127.0.0.1, so kubectl verifies TLS through it as it does direct."""
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.cluster import kubeconfig_file
    from bootstrap.remote.tunnel import Tunnel

    errors = []
    for server in inventory.servers:
        try:
            tunnel = Tunnel(inventory, server, state, local_port=port)
            local = tunnel.__enter__()
        except BootstrapError as exc:
            errors.append(exc.message)
            continue
        try:
            tunneled = state.path / "kubeconfig-tunnel"
            state.write_secret("kubeconfig-tunnel", kubeconfig_file.with_server(path, f"127.0.0.1:{local}"))
            context = kubeconfig_file.context_name(inventory)
            if merge:
                target = kubeconfig_file.default_target()
                kubeconfig_file.merge_into(target, kubeconfig_file.read_saved(tunneled))
                console.say(f"merged into {target} as context {context}, through the tunnel")
                use = f"kubectl --context {context} get nodes"
            else:
                use = f"KUBECONFIG={tunneled} kubectl get nodes"
            console.say(f"tunnel open: 127.0.0.1:{local} -> {server.name}:6443 over SSH; try: {use}")
            console.say("Ctrl-C closes it")
            done = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: done.set())
            try:
                done.wait()
            except KeyboardInterrupt:
                pass
            console.say("tunnel closed")
            return
        finally:
            tunnel.__exit__(None, None, None)
    raise HostsFailed("no server could be reached for the tunnel: " + "; ".join(errors))
