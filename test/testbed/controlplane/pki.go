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

// servingPKI is what the API server of a cluster with real nodes serves,
// signs and authenticates with: a serving certificate valid for every
// address clients reach it at (127.0.0.1 from the machine and through the
// node relays, the kubernetes Service's address from pods), the
// service-account token key pair, and the client certificate it presents to
// kubelets.
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
	// KubeletClientCA signed KubeletClientCertFile, the API server's client
	// certificate toward kubelets (user kube-apiserver-kubelet-client, as
	// kubeadm names it); kubelets trust it besides the API server's client
	// CA, whose key envtest keeps to itself.
	KubeletClientCA                             []byte
	KubeletClientCertFile, KubeletClientKeyFile string
}

// KubeletClientUser is the user the API server authenticates as to kubelets.
const KubeletClientUser = "kube-apiserver-kubelet-client"

// servingNames are the DNS names a kubeadm-made API server certificate holds.
var servingNames = []string{
	"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
}

// writeServingPKI writes a fresh serving CA and certificate for ips and
// servingNames, an RSA service-account key pair, and a kubelet-client CA and
// certificate into dir.
func writeServingPKI(dir string, ips []net.IP) (*servingPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, caKey, caPEM, err := newCA("mptcp-testbed-apiserver-ca")
	if err != nil {
		return nil, err
	}
	servingCert, servingKey, err := newLeaf(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    servingNames,
		IPAddresses: ips,
	})
	if err != nil {
		return nil, err
	}
	kca, kcaKey, kcaPEM, err := newCA("mptcp-testbed-kubelet-client-ca")
	if err != nil {
		return nil, err
	}
	kubeletCert, kubeletKey, err := newLeaf(kca, kcaKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: KubeletClientUser},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
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
		CA:                    caPEM,
		CAFile:                filepath.Join(dir, "serving-ca.crt"),
		CertFile:              filepath.Join(dir, "apiserver.crt"),
		KeyFile:               filepath.Join(dir, "apiserver.key"),
		SAKeyFile:             filepath.Join(dir, "sa.key"),
		SAPubFile:             filepath.Join(dir, "sa.pub"),
		KubeletClientCA:       kcaPEM,
		KubeletClientCertFile: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		KubeletClientKeyFile:  filepath.Join(dir, "apiserver-kubelet-client.key"),
	}
	files := map[string][]byte{
		p.CAFile:                caPEM,
		p.CertFile:              servingCert,
		p.KeyFile:               servingKey,
		p.SAKeyFile:             pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saDER}),
		p.SAPubFile:             pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		p.KubeletClientCertFile: kubeletCert,
		p.KubeletClientKeyFile:  kubeletKey,
	}
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// newCA makes a self-signed CA valid for a day (a test run).
func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// newLeaf signs tmpl (subject, usages, names) with the CA and returns the
// certificate and a new key, in PEM.
func newLeaf(ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = ca.NotBefore, ca.NotAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}
