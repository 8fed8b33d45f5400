// Package keyfile reads and creates the node's private key files (the
// store's at-rest key, the sealing key): owner-only, bounded in size, and
// written durably once, never replaced.
package keyfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Read returns at most max bytes of the key file at path (more is an
// error). A file that group or others may read is refused, so a key copied
// with loose permissions is noticed rather than used. what names the file
// in errors ("the store's key file"); a missing file wraps fs.ErrNotExist.
func Read(path, what string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", what, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if st.Mode()&0o077 != 0 {
		return nil, fmt.Errorf("%s %s has mode %v: others may read it; chmod 600 it", what, path, st.Mode().Perm())
	}
	raw, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s %s: %w", what, path, err)
	}
	if len(raw) > max {
		return nil, fmt.Errorf("%s %s is larger than %d bytes", what, path, max)
	}
	return raw, nil
}

// Create writes content to a new file at path with mode 0600, synced with
// its directory; it fails if the file exists, and leaves nothing behind when
// the write fails.
func Create(path, what string, content []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", what, err)
	}
	_, err = f.Write(content)
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("writing %s %s: %w", what, path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
