"""The node command lines and environments of every file under deploy/, for tests/deploy.rs.

python deploy_configs.py REPO_ROOT  ->  a JSON list of
  {"source": "...", "env": {"MINK_...": "..."}, "argv": ["node", ...], "shell": "..." or null,
   "node_id": N}
`argv` follows the `mink` binary; `shell`, when set, is the container's own shell command
(with `mink` in it), run as written. Values the files take from outside (Kubernetes secrets,
the pod name, `docker run -e`) get sample values, named in SAMPLES; files the units point at
(/etc/mink/mink.toml) are the ones in deploy/ they say to install.
"""

import json
import re
import shlex
import sys
from pathlib import Path

import yaml

root = Path(sys.argv[1])
deploy = root / "deploy"
SAMPLES = {
    "metadata": "postgres://mink@postgres.internal/mink",
    "object-store": "s3://mink-data/prod?region=us-east-1",
    "POD_NAME": "mink-2",
    "POD_NAMESPACE": "default",
}
out = []

# Dockerfile: ENV lines, ENTRYPOINT + CMD; the usage comment's -e settings are the operator's.
docker = (deploy / "Dockerfile").read_text()
env = {}
for block in re.findall(r"^ENV (.+?)(?<!\\)$", docker, re.S | re.M):
    for pair in shlex.split(block.replace("\\\n", " ")):
        k, v = pair.split("=", 1)
        env[k] = v
entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", docker, re.M).group(1))
cmd = json.loads(re.search(r"^CMD (\[.*\])$", docker, re.M).group(1))
assert entry == ["mink"], entry
env.update(
    {
        "MINK_NODE_ID": "1",
        "MINK_METADATA": SAMPLES["metadata"],
        "MINK_OBJECT_STORE": SAMPLES["object-store"],
        "MINK_ADVERTISED_ADDRESS": "10.0.0.5:7171",
    }
)
out.append({"source": "deploy/Dockerfile", "env": env, "argv": cmd, "shell": None, "node_id": 1})

# compose.yaml: every service running the image's `node` command (anchors and merges resolved).
compose = yaml.safe_load((deploy / "compose.yaml").read_text())
for name, service in compose["services"].items():
    if service.get("command") != ["node"]:
        continue
    env = {k: str(v) for k, v in service["environment"].items()}
    out.append(
        {
            "source": f"deploy/compose.yaml {name}",
            "env": env,
            "argv": ["node"],
            "shell": None,
            "node_id": int(env["MINK_NODE_ID"]),
        }
    )

# Kubernetes: the StatefulSet's container, its env with secrets and the downward API filled in.
for doc in yaml.safe_load_all((deploy / "kubernetes" / "mink.yaml").read_text()):
    if doc["kind"] != "StatefulSet":
        continue
    container = doc["spec"]["template"]["spec"]["containers"][0]
    env = {}
    for e in container["env"]:
        if "value" in e:
            value = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            value = SAMPLES[e["valueFrom"]["secretKeyRef"]["key"]]
        else:
            value = SAMPLES[e["name"]]
        env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)
    command = container["command"]
    assert command[:2] == ["sh", "-c"], command
    ordinal = int(SAMPLES["POD_NAME"].rsplit("-", 1)[1])
    out.append(
        {
            "source": "deploy/kubernetes/mink.yaml",
            "env": env,
            "argv": None,
            "shell": command[2],
            "node_id": ordinal + 1,
        }
    )

# systemd: Environment= lines and ExecStart (its MINK_CONFIG is deploy/mink.toml, installed).
unit = (deploy / "systemd" / "mink.service").read_text()
env = {}
for line in unit.splitlines():
    if line.startswith("Environment="):
        k, v = line[len("Environment=") :].split("=", 1)
        env[k] = v
if env.get("MINK_CONFIG") == "/etc/mink/mink.toml":
    env["MINK_CONFIG"] = str(deploy / "mink.toml")
start = shlex.split(re.search(r"^ExecStart=(.+)$", unit, re.M).group(1))
assert start[0].endswith("/mink"), start
out.append({"source": "deploy/systemd/mink.service", "env": env, "argv": start[1:], "shell": None, "node_id": 1})

print(json.dumps(out))
