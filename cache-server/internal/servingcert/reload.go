package servingcert

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// Files serves a certificate and key from files and picks up new ones
// without a restart: the operator rotates the fleet's serving certificate
// in its Secret, the kubelet updates the mounted files, and a shard that
// restarted for it would drop its whole cache.
type Files struct {
	cert, key string
	// every bounds how often the files are looked at (handshakes are
	// frequent; rotation is rare).
	every time.Duration

	mu      sync.Mutex
	checked time.Time
	modTime [2]time.Time
	current *tls.Certificate
}

// LoadFiles reads the pair once (failing early on a bad pair) and returns
// a Files that re-reads it when either file's modification time changes.
func LoadFiles(certFile, keyFile string) (*Files, error) {
	f := &Files{cert: certFile, key: keyFile, every: 10 * time.Second}
	if err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// GetCertificate is tls.Config.GetCertificate. A pair that fails to load
// (e.g. caught between the two files' updates) keeps the previous one.
func (f *Files) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) >= f.every {
		f.checked = time.Now()
		_ = f.reloadLocked()
	}
	return f.current, nil
}

func (f *Files) reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checked = time.Now()
	return f.reloadLocked()
}

func (f *Files) reloadLocked() error {
	var mod [2]time.Time
	for i, p := range []string{f.cert, f.key} {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		mod[i] = st.ModTime()
	}
	if f.current != nil && mod == f.modTime {
		return nil
	}
	pair, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return fmt.Errorf("serving certificate %s / %s: %w", f.cert, f.key, err)
	}
	f.current, f.modTime = &pair, mod
	return nil
}
