"""Join tokens (issue 23, items 2 and 3): the server token reaches servers only, agents join
with the tool's agent token, joins name the cluster CA's hash once the first server made it,
and what a host returns for that hash is checked before it reaches any config.yaml."""

import contextlib
import hashlib
import io
from dataclasses import replace

import pytest
import yaml
from fakes import FakeSession
from sandbox import k3s  # noqa: F401  (k3s: the built stand-in, a fixture)
from test_host_phase_flow import healthy_host
from test_restore_flow import KUBECONFIG

from bootstrap import progress
from bootstrap.errors import BootstrapError, UsageError
from bootstrap.host.facts.host_facts import FileState, K3sInstall, SystemdUnit
from bootstrap.flows.host_phase import (NO_AGENT_TOKEN, UpOptions, bring_up, gather_facts, load_or_create_tokens, preflight_and_plan)
from bootstrap.flows.run import Run
from bootstrap.flows.inspection import token_plan
from bootstrap.host.parts.k3s_binary import PATH as K3S_BINARY
from bootstrap.host.parts.k3s_service import CONFIG, KUBECONFIG as KUBECONFIG_PATH
from bootstrap.host.plan import k3sconfig
from bootstrap.host.plan.join_tokens import LEGACY_NOTE, SERVER_TOKEN_FILE, JoinTokens, ca_hash_from_server_token
from bootstrap.host.parts import placing
from bootstrap.remote import archive
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir

VERSION = "v1.33.5+k3s1"
CA = "c0ffee" + "0" * 58
TOKENS = JoinTokens("server-secret-0123", "agent-secret-4567", ca_hash=CA)


def gather_and_plan(session, inventory, state, console, *, facts=None, **options):
    """`plan`'s first phases on an open session: (facts, plans)."""
    run = Run(inventory, state, console)
    run.attach(session)
    run.set_facts(facts if facts is not None else gather_facts(session, inventory))
    return run.facts, preflight_and_plan(run, **options)


def inventory_of(tmp_path, k3s_binary=None, servers=1, agents=2):
    path = tmp_path / "inv.yaml"
    nodes = [{"name": f"cp-{i}", "address": f"10.0.0.{i}", "role": "server", "gpu": {"enabled": False}}
             for i in range(1, servers + 1)]
    nodes += [{"name": f"a{i}", "address": f"10.0.1.{i}", "gpu": {"enabled": False}} for i in range(1, agents + 1)]
    k3s_section = {"airgap": str(k3s_binary.parent), "version": VERSION} if k3s_binary else {}
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "k3s": k3s_section, "nodes": nodes}))
    return load_inventory(path)


# --- what each node's config.yaml says -------------------------------------------------------

def test_agents_get_the_agent_token_only_and_servers_hold_both(tmp_path):
    inv = inventory_of(tmp_path, servers=3, agents=1)
    first, second, agent = (k3sconfig.node_config(inv, inv.node(n), TOKENS) for n in ("cp-1", "cp-2", "a1"))
    assert first["token"] == TOKENS.server and first["agent-token"] == TOKENS.agent  # cluster-init: short
    assert second["token"] == f"K10{CA}::server:{TOKENS.server}" and second["agent-token"] == TOKENS.agent
    assert agent["token"] == f"K10{CA}::node:{TOKENS.agent}"
    assert TOKENS.server not in k3sconfig.render(agent)


def test_before_the_ca_exists_tokens_are_short():
    tokens = replace(TOKENS, ca_hash=None)
    assert tokens.for_agent() == TOKENS.agent and tokens.for_joining_server() == TOKENS.server
    with pytest.raises(ValueError):
        JoinTokens("a" * 8, "b" * 8, ca_hash="not-a-hash")


def test_private_mode_servers_advertise_their_node_ip(tmp_path):
    """Item 11: with node-external-ip set (a NAT'd host), k3s would advertise the public
    address; the server's config pins it to node-ip."""
    path = tmp_path / "nat.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "nodes": [
        {"name": "cp-1", "address": "203.0.113.10", "node_ip": "10.0.0.10", "role": "server"},
        {"name": "a1", "address": "203.0.113.11", "node_ip": "10.0.0.11"}]}))
    inv = load_inventory(path)
    server = k3sconfig.node_config(inv, inv.node("cp-1"), TOKENS)
    assert server["node-external-ip"] == "203.0.113.10" and server["advertise-address"] == "10.0.0.10"
    assert "advertise-address" not in k3sconfig.node_config(inv, inv.node("a1"), TOKENS)


# --- the hash read back from the first server ----------------------------------------------

@pytest.mark.parametrize("text,why", [
    (None, "could not be read"),
    ("", "format"),
    (f"K10{CA}::server:another-clusters-token\n", "another cluster"),
    (f"K10{CA[:-1]}::server:{TOKENS.server}\n", "format"),
    (f"K10{CA.upper()}::server:{TOKENS.server}\n", "format"),
    (f"K10{CA}::node:{TOKENS.server}\n", "format"),
    # a YAML or shell payload riding on the file: never into a config.yaml
    (f"K10{CA}::server:{TOKENS.server}\nextra: [injected]\n", "format"),
    (f"K10{CA}\n  server: https://evil::server:{TOKENS.server}\n", "format"),
])
def test_a_server_token_file_that_is_not_ours_is_refused(text, why):
    with pytest.raises(ValueError, match=why):
        ca_hash_from_server_token(text, TOKENS.server)


def test_the_hash_of_our_own_token_file_is_taken():
    assert ca_hash_from_server_token(f"K10{CA}::server:{TOKENS.server}\n", TOKENS.server) == CA


# --- the state folder ---------------------------------------------------------------------

@pytest.mark.parametrize("name,text", [("token", ""), ("token", "\n"), ("agent-token", "a b\n"),
                                       ("agent-token", "\x1b[2Jnope\n"), ("ca-hash", "zz\n")])
def test_an_empty_or_damaged_secret_is_an_error_naming_the_file(tmp_path, name, text):
    inv = inventory_of(tmp_path)
    state = StateDir(inv)
    state.write_secret("token", "server-secret-0123\n")
    state.write_secret(name, text)
    with pytest.raises(UsageError, match=f"{state.path / name} is (empty|damaged|not one line)"):
        load_or_create_tokens(state, {}, inv)


def test_an_old_state_folder_gets_an_agent_token_when_up_converges(tmp_path):
    inv = inventory_of(tmp_path)
    state = StateDir(inv)
    state.write_secret("token", "server-secret-0123\n")
    assert load_or_create_tokens(state, {}, inv, create=False).agent.startswith("<")  # plan makes none
    assert not (state.path / "agent-token").exists()
    tokens = load_or_create_tokens(state, {}, inv, create=False, create_agent=True)
    assert (state.path / "agent-token").read_text() == tokens.agent + "\n"
    assert (state.path / "agent-token").stat().st_mode & 0o777 == 0o600
    assert tokens.agent != tokens.server and len(tokens.agent) == 48


# --- `up` on a new cluster, in-process --------------------------------------------------------

class JoinSession(FakeSession):
    """Records each host's config.yaml as its step carries it, and answers the first
    server's server/token (k3s writes it on first start) once that server's step ran."""

    def __init__(self, inventory, facts, state, token_file=None):
        super().__init__(inventory, facts)
        self.state, self.token_file = state, token_file
        self.configs: dict[str, str] = {}
        self.batches: list[list[str]] = []  # the hosts of each execute() call
        self.steps: list[dict] = []  # {step: its hosts} of each execute() call
        self.step_objects: list[list] = []
        self.token_reads = 0
        self.reads: list[str] = []  # the paths read, in order

    def execute(self, steps, after=None):
        self.batches.append(sorted({n for s in steps for n in s.commands}))
        self.steps.append({s.name: sorted(s.commands) for s in steps if s.commands})
        self.step_objects.append(list(steps))
        for step in steps:
            for name, commands in step.commands.items():
                for command in commands:
                    if not getattr(command, "function", None):
                        continue
                    script, sources = command.args
                    for index, source in enumerate(sources):
                        if placing.place(archive.staged(index), 0o600, CONFIG) in script:
                            self.configs[name] = source.getvalue().decode()
        return super().execute(steps, after)

    def read_root_file(self, name, path):
        self.reads.append(path)
        if path == SERVER_TOKEN_FILE:
            self.token_reads += 1
            if self.token_file is not None:
                return self.token_file
            token = (self.state.path / "token").read_text().strip()
            return f"K10{CA}::server:{token}\n"
        return KUBECONFIG


def up(inventory, state, session):
    bring_up(inventory, state, UpOptions(hosts_only=True), progress.Console(progress.Reporter(io.StringIO())),
             open_session=lambda *a: contextlib.nullcontext(session))


def fresh_facts(inventory):
    return {n.name: replace(healthy_host(n.name), gpus=[]) for n in inventory.nodes}


def test_a_new_cluster_starts_its_first_server_then_joins_with_secure_tokens(k3s, tmp_path):  # noqa: F811
    inv = inventory_of(tmp_path, k3s, servers=3, agents=2)
    state = StateDir(inv)
    session = JoinSession(inv, fresh_facts(inv), state)
    up(inv, state, session)
    server_token = (state.path / "token").read_text().strip()
    agent_token = (state.path / "agent-token").read_text().strip()
    assert agent_token != server_token and (state.path / "ca-hash").read_text().strip() == CA
    # Every host is prepared while the first server starts; the joins follow, with the hash.
    assert session.batches == [["a1", "a2", "cp-1", "cp-2", "cp-3"], ["a1", "a2", "cp-2", "cp-3"]]
    # The first server is placed and started in the step that prepares the others (one
    # round trip, not two, before the CA can be read).
    assert session.steps[0] == {"prepare host": ["a1", "a2", "cp-1", "cp-2", "cp-3"]}
    assert session.step_objects[0][0].label("cp-1") == "prepare host, start server cp-1"
    # The kubeconfig is read beside the CA's hash and the joins, not before them: the first
    # step's end does not wait for it.
    assert session.reads[:2] == [SERVER_TOKEN_FILE, KUBECONFIG_PATH] and session.batches[1]
    # Their config.yaml travels in the command that starts them: no "prepare host" step (a
    # round trip) before the joins.
    assert session.steps[1] == {"join server cp-2": ["cp-2"], "join server cp-3": ["cp-3"], "join agents": ["a1", "a2"]}
    configs = {n: yaml.safe_load(text) for n, text in session.configs.items()}
    assert configs["cp-1"]["token"] == server_token and configs["cp-1"]["agent-token"] == agent_token
    for server in ("cp-2", "cp-3"):
        assert configs[server]["token"] == f"K10{CA}::server:{server_token}"
        assert configs[server]["agent-token"] == agent_token
    for agent in ("a1", "a2"):
        assert configs[agent]["token"] == f"K10{CA}::node:{agent_token}"
        assert server_token not in session.configs[agent]
    # The next run knows the hash: no round trip for it.
    reads = session.token_reads
    gather_and_plan(session, inv, state, progress.Console(progress.Reporter(io.StringIO())), create_token=True,
                    facts=session.facts)
    assert session.token_reads == reads


def test_a_first_server_that_answers_another_token_file_stops_the_joins(k3s, tmp_path):  # noqa: F811
    inv = inventory_of(tmp_path, k3s, servers=1, agents=1)
    state = StateDir(inv)
    session = JoinSession(inv, fresh_facts(inv), state, token_file=f"K10{CA}::server:not-ours-at-all\n")
    with pytest.raises(BootstrapError, match="cannot learn the cluster CA's hash from cp-1: .* another cluster"):
        up(inv, state, session)
    assert session.batches == [["a1", "cp-1"]] and "a1" not in session.configs  # prepared, never configured
    assert not (state.path / "ca-hash").exists()


def running_cluster(k3s, tmp_path):
    """A cluster `up` built before agent tokens: every node holds the server token; the
    state folder has its token only."""
    inv = inventory_of(tmp_path, k3s, servers=1, agents=1)
    state = StateDir(inv)
    state.write_secret("token", "server-secret-0123\n")
    sha = hashlib.sha256(k3s.read_bytes()).hexdigest()
    old = JoinTokens("server-secret-0123", None)  # what every node held before
    facts = {}
    for node in inv.nodes:
        unit = "k3s" if node.name == "cp-1" else "k3s-agent"
        config = k3sconfig.render(k3sconfig.node_config(inv, node, old))
        facts[node.name] = replace(healthy_host(node.name), gpus=[],
                                   manifest={"cluster_id": state.cluster_id, "cluster": "t"},
                                   files={K3S_BINARY: FileState(0o755, sha),
                                          CONFIG: FileState(0o600, hashlib.sha256(config.encode()).hexdigest())},
                                   k3s=K3sInstall(K3S_BINARY, VERSION, True,
                                                  [SystemdUnit(f"{unit}.service", "loaded", "active", "enabled")]))
    return inv, state, facts


def test_a_cluster_built_before_agent_tokens_never_gets_one_and_plan_says_why(k3s, tmp_path):  # noqa: F811
    """k3s keeps the agent token in its datastore's bootstrap data: a server restarted with
    a new agent-token refuses its next start (the stand-in's test of it:
    test_an_agent_token_added_to_a_running_cluster_is_fatal_at_the_servers_next_start). So
    the servers keep running without one, the agents keep the server token (now in the
    secure format) and `plan` and `up` say why."""
    inv, state, facts = running_cluster(k3s, tmp_path)
    session = JoinSession(inv, facts, state)
    console_text = io.StringIO()
    console = progress.Console(progress.Reporter(console_text))
    _, plans = gather_and_plan(session, inv, state, console, create_token=False, facts=facts)
    assert f"update {CONFIG}" not in plans.plans["cp-1"].changes  # the server is left as it runs
    assert token_plan(plans.tokens) == [f"tokens: {LEGACY_NOTE}"]
    assert not (state.path / "agent-token").exists() and not (state.path / NO_AGENT_TOKEN).exists()
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        up(inv, state, session)
    assert f"warning: {LEGACY_NOTE}" in said.getvalue().replace("\n", " ")
    assert not (state.path / "agent-token").exists() and (state.path / NO_AGENT_TOKEN).exists()
    assert "cp-1" not in session.configs  # no agent-token reached the running server
    assert yaml.safe_load(session.configs["a1"])["token"] == f"K10{CA}::node:server-secret-0123"
    # The next run knows it from the mark (and the CA hash it learnt).
    _, again = gather_and_plan(session, inv, state, console, create_token=False, facts=facts)
    assert again.tokens.agent is None and again.tokens.ca_hash == CA


def test_a_running_cluster_whose_state_folder_lost_its_agent_token_is_refused(k3s, tmp_path):  # noqa: F811
    inv, state, facts = running_cluster(k3s, tmp_path)
    state.write_secret("ca-hash", CA + "\n")  # written by a run that knew the agent token
    session = JoinSession(inv, facts, state)
    console = progress.Console(progress.Reporter(io.StringIO()))
    with pytest.raises(UsageError, match="agent-token is missing, and the cluster's servers run with an agent token"):
        gather_and_plan(session, inv, state, console, create_token=False, facts=facts)