package testenv

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TokenIssuer is the issuer (iss) of the service-account tokens of a control
// plane started with ServiceAccountTokens.
const TokenIssuer = "https://mptcp-operator.test/serviceaccount-issuer"

// ServiceAccountTokens makes the API server issue and verify bound
// service-account tokens (the TokenRequest API) signed with an RSA key the
// test generates into its temporary directory, so that the test can check a
// token's signature and claims itself (Env.TokenClaims).
//
// No feature gate is needed on v1.36: ServiceAccountTokenPodNodeInfo (the
// node's name and uid in the claims of a pod-bound token, and the user extra
// authentication.kubernetes.io/node-name) is GA and locked on since v1.32.
func ServiceAccountTokens() Option {
	return func(tb testing.TB, env *Env, e *envtest.Environment) {
		tb.Helper()
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			tb.Fatalf("service-account signing key: %v", err)
		}
		priv, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			tb.Fatal(err)
		}
		pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
		if err != nil {
			tb.Fatal(err)
		}
		dir := tb.TempDir()
		keyFile := filepath.Join(dir, "sa-signing.key")
		pubFile := filepath.Join(dir, "sa-signing.pub")
		if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}), 0o600); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
			tb.Fatal(err)
		}
		// envtest sets these three flags with a key of its own; Set replaces
		// its values, so the API server signs and verifies with ours only.
		e.ControlPlane.GetAPIServer().Configure().
			Set("service-account-issuer", TokenIssuer).
			Set("service-account-signing-key-file", keyFile).
			Set("service-account-key-file", pubFile).
			Set("api-audiences", TokenIssuer)
		env.tokenKey, env.issuer = &key.PublicKey, TokenIssuer
	}
}

// PodToken asks the TokenRequest API, as kubelet does for a projected volume,
// for a token of the pod's service account bound to the pod (its name and
// uid). The API server puts the pod's node into the token.
func (e *Env) PodToken(tb testing.TB, pod *corev1.Pod) string {
	tb.Helper()
	return e.token(tb, pod.Namespace, pod.Spec.ServiceAccountName, &authenticationv1.BoundObjectReference{
		Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID,
	})
}

// UnboundToken is a token of service account ns/name bound to no object
// (`kubectl create token`): it carries no node.
func (e *Env) UnboundToken(tb testing.TB, ns, name string) string {
	tb.Helper()
	return e.token(tb, ns, name, nil)
}

func (e *Env) token(tb testing.TB, ns, name string, ref *authenticationv1.BoundObjectReference) string {
	tb.Helper()
	if e.tokenKey == nil {
		tb.Fatal("the control plane was started without testenv.ServiceAccountTokens()")
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: ref}}
	if err := e.Client.SubResource("token").Create(context.Background(), sa, tr); err != nil {
		tb.Fatalf("token request for %s/%s: %v", ns, name, err)
	}
	if tr.Status.Token == "" {
		tb.Fatalf("token request for %s/%s returned no token", ns, name)
	}
	return tr.Status.Token
}

// AsToken returns credentials made of the bearer token alone: no client
// certificate, no impersonation, no user name; the CA only lets the client
// verify the server.
func (e *Env) AsToken(token string) *rest.Config {
	return &rest.Config{
		Host:            e.Config.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.Config.CAData},
		QPS:             e.Config.QPS,
		Burst:           e.Config.Burst,
	}
}

// TokenClaims are the claims of a service-account token that tests look at.
type TokenClaims struct {
	Issuer     string   `json:"iss"`
	Subject    string   `json:"sub"`
	Audience   []string `json:"aud"`
	Kubernetes struct {
		Namespace      string     `json:"namespace"`
		ServiceAccount *ObjectRef `json:"serviceaccount"`
		Pod            *ObjectRef `json:"pod"`
		Node           *ObjectRef `json:"node"`
	} `json:"kubernetes.io"`
}

// ObjectRef is an object named in a token's claims.
type ObjectRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// TokenClaims checks that token is an RS256 JWT signed with the key
// ServiceAccountTokens generated, and returns its claims.
func (e *Env) TokenClaims(tb testing.TB, token string) TokenClaims {
	tb.Helper()
	if e.tokenKey == nil {
		tb.Fatal("the control plane was started without testenv.ServiceAccountTokens()")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		tb.Fatalf("token has %d parts, not 3", len(parts))
	}
	var header struct {
		Alg string `json:"alg"`
	}
	decode := func(i int, into any) {
		raw, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			tb.Fatalf("token part %d: %v", i, err)
		}
		if err := json.Unmarshal(raw, into); err != nil {
			tb.Fatalf("token part %d: %v", i, err)
		}
	}
	decode(0, &header)
	if header.Alg != "RS256" {
		tb.Fatalf("token signed with %q, want RS256", header.Alg)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		tb.Fatalf("token signature: %v", err)
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(e.tokenKey, crypto.SHA256, digest[:], sig); err != nil {
		tb.Fatalf("token not signed with the test's key: %v", err)
	}
	var claims TokenClaims
	decode(1, &claims)
	if claims.Issuer != e.issuer {
		tb.Fatalf("token issuer %q, want %q", claims.Issuer, e.issuer)
	}
	return claims
}
