// Command saread is a test workload for the kube-api-access volume. It
// reads the service-account files in /var/run/secrets/kubernetes.io/
// serviceaccount and prints, one a line:
//
//	namespace=NS
//	ca=SUBJECT                  the CA certificate's subject
//	sub=SUBJECT pod=NAME        the token's claims (its subject, the pod it is bound to)
//	token-sha256=HEX            the token's digest, not the token
//	write DIR=read-only         for the directory and each of $WRITE_DIRS (space-separated)
//
// Then it prints token-sha256 again whenever the token changes, until
// SIGTERM.
package main

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const dir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)

	ns, err := os.ReadFile(filepath.Join(dir, "namespace"))
	fmt.Printf("namespace=%s%s\n", ns, errText(err))
	fmt.Printf("ca=%s\n", caSubject())
	token, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		fmt.Printf("token: %v\n", err)
	}
	fmt.Println(claims(string(token)))
	fmt.Printf("token-sha256=%x\n", sha256.Sum256(token))
	for _, d := range append([]string{dir}, strings.Fields(os.Getenv("WRITE_DIRS"))...) {
		fmt.Printf("write %s=%s\n", d, tryWrite(d))
	}

	last := sha256.Sum256(token)
	tick := time.NewTicker(200 * time.Millisecond)
	for {
		select {
		case <-term:
			return
		case <-tick.C:
		}
		token, err := os.ReadFile(filepath.Join(dir, "token"))
		if err != nil {
			fmt.Printf("token: %v\n", err)
			continue
		}
		if sum := sha256.Sum256(token); sum != last {
			last = sum
			fmt.Printf("token-sha256=%x\n", sum)
		}
	}
}

func errText(err error) string {
	if err != nil {
		return " " + err.Error()
	}
	return ""
}

func caSubject() string {
	data, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err.Error()
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return "no PEM block"
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err.Error()
	}
	return cert.Subject.String()
}

// claims reads the claims of a JWT without checking its signature: the
// API server's TokenReview does that.
func claims(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "claims: not a JWT"
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "claims: " + err.Error()
	}
	var c struct {
		Sub string `json:"sub"`
		K8s struct {
			Pod struct {
				Name string `json:"name"`
			} `json:"pod"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "claims: " + err.Error()
	}
	return fmt.Sprintf("sub=%s pod=%s", c.Sub, c.K8s.Pod.Name)
}

func tryWrite(d string) string {
	err := os.WriteFile(filepath.Join(d, "probe"), []byte("x"), 0o644)
	switch {
	case errors.Is(err, syscall.EROFS):
		return "read-only"
	case err != nil:
		return err.Error()
	}
	return "writable"
}
