#!/usr/bin/env bash
# make demo: a cluster of two Cairn nodes in QEMU (cairn qemu cluster) and
# a sample app on it, a Deployment of two pods behind a NodePort Service;
# prints how to reach it. The cluster stays until
# `_out/bin/cairn qemu cluster destroy --name demo`. CAIRN_DEMO_NAME names
# the cluster otherwise (a test runs the demo beside a user's).
set -euo pipefail
cd "$(dirname "$0")/.."

out=_out
name=${CAIRN_DEMO_NAME:-demo}
cairn="$out/bin/cairn"
kubectl="$out/cluster/bin/kubectl --kubeconfig $out/clusters/$name/kubeconfig"
port=30080

"$cairn" qemu cluster create --name "$name" --nodes 2 --node-port "$port"

# The app: test/images/hello answering HTTP with its pod's name.
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags '-s -w' -o "$out/demo/hello" ./test/images/hello
"$cairn" qemu cluster push --name "$name" "$out/demo/hello" demo/hello:v1
registry=$(sed -n 's/.*"nodeRegistry": "\(.*\)".*/\1/p' "$out/clusters/$name/state.json")

$kubectl apply -f - <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: hello}
spec:
  replicas: 2
  selector: {matchLabels: {app: hello}}
  template:
    metadata: {labels: {app: hello}}
    spec:
      # One pod on each node.
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: hello}}}
      containers:
      - name: hello
        image: $registry/demo/hello:v1
        env: [{name: HELLO_HTTP, value: ":8080"}]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: hello}
spec:
  type: NodePort
  selector: {app: hello}
  ports: [{port: 80, targetPort: 8080, nodePort: $port}]
YAML
$kubectl rollout status deployment/hello --timeout 5m
$kubectl get pods -o wide

echo
echo "The app answers on each node's NodePort $port, forwarded to this machine:"
"$cairn" qemu cluster status --name "$name" | awk 'NR > 1 && $1 ~ /^node-/ { print "  curl http://" $4 "/" }'
echo "Inside the cluster it is http://hello.default.svc.cluster.local/."
echo "kubectl: $kubectl get pods -o wide"
echo "When done: $cairn qemu cluster destroy --name $name"
