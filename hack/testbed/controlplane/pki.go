package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// servingPKI is what the API server of a cluster with real nodes serves and
// signs with: a serving certificate valid for every address clients reach it
// at (127.0.0.1 from the machine and through the node relays, the kubernetes
// Service's address from pods), and the service-account token key pair.
type servingPKI struct {
	// CA is the PEM certificate that signed the serving certificate: the
	// root-ca-file of kube-controller-manager, which publishes it to every
	// namespace as ConfigMap kube-root-ca.crt for pods to trust.
	CA []byte
	// CAFile holds CA.
	CAFile string
	// CertFile and KeyFile are the API server's serving pair, named as
	// envtest expects them in its certificate directory.
	CertFile, KeyFile string
	// SAKeyFile signs service-account tokens and SAPubFile verifies them.
	SAKeyFile, SAPubFile string
}

// servingNames are the DNS names a kubeadm-made API server certificate holds.
var servingNames = []string{
	"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
}

// writeServingPKI writes a fresh CA, a serving certificate for ips and
// servingNames, and an RSA service-account key pair into dir.
func writeServingPKI(dir string, ips []net.IP) (*servingPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "mptcp-testbed-apiserver-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     servingNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	p := &servingPKI{
		CA:        pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		CAFile:    filepath.Join(dir, "serving-ca.crt"),
		CertFile:  filepath.Join(dir, "apiserver.crt"),
		KeyFile:   filepath.Join(dir, "apiserver.key"),
		SAKeyFile: filepath.Join(dir, "sa.key"),
		SAPubFile: filepath.Join(dir, "sa.pub"),
	}
	files := map[string][]byte{
		p.CAFile:    p.CA,
		p.CertFile:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		p.KeyFile:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		p.SAKeyFile: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saDER}),
		p.SAPubFile: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
	}
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}
