package controlplane

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// NewBootstrapToken returns a token in the form [a-z0-9]{6}.[a-z0-9]{16}.
func NewBootstrapToken() (string, error) {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 22)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	for i := range b {
		b[i] = chars[int(b[i])%len(chars)]
	}
	return string(b[:6]) + "." + string(b[6:]), nil
}

// PrepareForNodes creates in the cluster of client what Cairn nodes need
// to join it with token (ID.SECRET), as kubeadm creates it for joining
// nodes: the bootstrap token Secret, the RBAC bindings that let bootstrap
// tokens ask for kubelet client certificates and have them approved, and
// the cluster-info ConfigMap (server, caPEM) that bootstrapsigner signs
// with the token; and the nodes' read access to what the agent's Service
// proxy and NetworkPolicy enforcer watch. What exists already is kept.
func PrepareForNodes(client kubernetes.Interface, token, server string, caPEM []byte) error {
	id, secret, _ := strings.Cut(token, ".")
	objects := []func(context.Context) error{
		func(ctx context.Context) error {
			_, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem},
				Type:       corev1.SecretTypeBootstrapToken,
				StringData: map[string]string{
					"description":                    "Cairn nodes joining",
					"token-id":                       id,
					"token-secret":                   secret,
					"usage-bootstrap-authentication": "true",
					"usage-bootstrap-signing":        "true",
					"auth-extra-groups":              BootstrapGroup,
				},
			}, metav1.CreateOptions{})
			return err
		},
		bindGroup(client, bindingBootstrapper, "system:bootstrappers", "system:node-bootstrapper"),
		bindGroup(client, bindingAutoApprove, "system:bootstrappers",
			"system:certificates.k8s.io:certificatesigningrequests:nodeclient"),
		bindGroup(client, bindingAutoRenew, "system:nodes",
			"system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"),
		// Cairn nodes program Services themselves, with their own
		// credentials: they read Services and EndpointSlices as kube-proxy.
		bindGroup(client, bindingNodeProxier, "system:nodes", "system:node-proxier"),
		// ... and enforce NetworkPolicy, reading the policies, pods and
		// namespaces of the whole cluster (docs/machine-config.md).
		func(ctx context.Context) error {
			_, err := client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: roleNodePolicy},
				Rules: []rbacv1.PolicyRule{
					{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}},
					{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}},
				},
			}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			return bindGroup(client, roleNodePolicy, "system:nodes", roleNodePolicy)(ctx)
		},
		func(ctx context.Context) error {
			kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
				Clusters: map[string]*clientcmdapi.Cluster{"": {Server: server, CertificateAuthorityData: caPEM}},
			})
			if err != nil {
				return err
			}
			_, err = client.CoreV1().ConfigMaps(metav1.NamespacePublic).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "cluster-info", Namespace: metav1.NamespacePublic},
				Data:       map[string]string{"kubeconfig": string(kubeconfig)},
			}, metav1.CreateOptions{})
			return err
		},
		func(ctx context.Context) error {
			_, err := client.RbacV1().Roles(metav1.NamespacePublic).Create(ctx, &rbacv1.Role{
				ObjectMeta: metav1.ObjectMeta{Name: "cairn:bootstrap-signer-clusterinfo"},
				Rules: []rbacv1.PolicyRule{{
					Verbs: []string{"get"}, APIGroups: []string{""},
					Resources: []string{"configmaps"}, ResourceNames: []string{"cluster-info"},
				}},
			}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			_, err = client.RbacV1().RoleBindings(metav1.NamespacePublic).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "cairn:bootstrap-signer-clusterinfo"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "cairn:bootstrap-signer-clusterinfo"},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:anonymous"}},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for i, create := range objects {
		// Right after /readyz the system namespaces may still be on their
		// way; retry what fails, but not what already exists.
		err := poll("create bootstrap object "+strconv.Itoa(i), 30*time.Second, func(ctx context.Context) (bool, error) {
			err := create(ctx)
			return err == nil || apierrors.IsAlreadyExists(err), err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func bindGroup(client kubernetes.Interface, name, group, role string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: group}},
		}, metav1.CreateOptions{})
		return err
	}
}

// RemoveBootstrapToken deletes token's Secret from the cluster of client:
// no node joins with it any more.
func RemoveBootstrapToken(ctx context.Context, client kubernetes.Interface, token string) error {
	id, _, _ := strings.Cut(token, ".")
	err := client.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, "bootstrap-token-"+id, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
