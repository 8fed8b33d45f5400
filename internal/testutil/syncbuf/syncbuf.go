// Package syncbuf is a bytes.Buffer that tests can read while a process or
// goroutine writes to it.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for one writer and concurrent readers.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
