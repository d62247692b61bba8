package classify_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/outboundhq/outbound/classify"
)

// certificate returns a self-signed certificate for names, valid from
// notBefore to notAfter, and a pool that trusts it.
func certificate(t *testing.T, names []string, notBefore, notAfter time.Time) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: notBefore, NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// handshake runs one TLS handshake between server and client over loopback
// and returns the client's error.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if server == nil { // not TLS at all: close at once
			return
		}
		tls.Server(c, server).HandshakeContext(context.Background())
	}()
	defer func() { <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return tls.Client(c, client).HandshakeContext(context.Background())
}

// TestTLSRefusalsOfThisGoVersion pins, with real handshakes, every TLS
// failure that TLSRefused calls permanent, and two that it must not.
func TestTLSRefusalsOfThisGoVersion(t *testing.T) {
	now := time.Now()
	good, trusted := certificate(t, []string{"upstream.test"}, now.Add(-time.Hour), now.Add(time.Hour))
	expired, trustedExpired := certificate(t, []string{"upstream.test"}, now.Add(-2*time.Hour), now.Add(-time.Hour))
	future, trustedFuture := certificate(t, []string{"upstream.test"}, now.Add(time.Hour), now.Add(2*time.Hour))
	serve := func(c tls.Certificate) *tls.Config { return &tls.Config{Certificates: []tls.Certificate{c}} }
	for name, tc := range map[string]struct {
		server, client *tls.Config
		want           bool
	}{
		"unknown authority": {serve(good), &tls.Config{ServerName: "upstream.test"}, true},
		"hostname mismatch": {serve(good), &tls.Config{ServerName: "other.test", RootCAs: trusted}, true},
		"expired":           {serve(expired), &tls.Config{ServerName: "upstream.test", RootCAs: trustedExpired}, true},
		"not yet valid":     {serve(future), &tls.Config{ServerName: "upstream.test", RootCAs: trustedFuture}, true},
		"server refuses the version": {&tls.Config{Certificates: []tls.Certificate{good}, MinVersion: tls.VersionTLS13},
			&tls.Config{ServerName: "upstream.test", RootCAs: trusted, MaxVersion: tls.VersionTLS12}, true},
		"client refuses the version": {&tls.Config{Certificates: []tls.Certificate{good}, MaxVersion: tls.VersionTLS12},
			&tls.Config{ServerName: "upstream.test", RootCAs: trusted, MinVersion: tls.VersionTLS13}, true},
		"no common application protocol": {&tls.Config{Certificates: []tls.Certificate{good}, NextProtos: []string{"h2"}},
			&tls.Config{ServerName: "upstream.test", RootCAs: trusted, NextProtos: []string{"spdy/3"}}, true},
		"connection closed during the handshake": {nil, &tls.Config{ServerName: "upstream.test", RootCAs: trusted}, false},
		"a good certificate":                     {serve(good), &tls.Config{ServerName: "upstream.test", RootCAs: trusted}, false},
	} {
		t.Run(name, func(t *testing.T) {
			err := handshake(t, tc.server, tc.client)
			if classify.TLSRefused(err) != tc.want || (err == nil) != (name == "a good certificate") {
				t.Fatalf("TLSRefused(%T %v) = %t, want %t", err, err, classify.TLSRefused(err), tc.want)
			}
		})
	}
}
