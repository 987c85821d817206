# Sourced by the scripts that build Kubernetes binaries from test/cluster,
# in that directory. kube_version_ldflags prints the -X flags that stamp
# the pinned k8s.io/kubernetes version: without them gitVersion is
# v0.0.0-master+$Format and clients fail to parse the server's version
# (e2e.test and kubectl compare theirs with it).
kube_version_ldflags() {
	local v major minor x='' p
	v=$($GO list -m -f '{{.Version}}' k8s.io/kubernetes)
	major=${v#v}
	major=${major%%.*}
	minor=${v#v*.}
	minor=${minor%%.*}
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		x+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
		x+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	echo "$x"
}
