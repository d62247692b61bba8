// Command echo-server is the upstream of the end-to-end benchmarks. It runs
// in its own process so that the client's allocations are measured alone.
//
// It listens on 127.0.0.1 on a free port, prints its base URL
// ("http://127.0.0.1:PORT") as the first line on stdout, and answers "ok\n"
// to every request. It exits when its standard input reaches end of file
// (the benchmark closes it, or the benchmark process died) or on SIGINT or
// SIGTERM.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

var body = []byte("ok\n")

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			h := w.Header()
			h["Content-Type"] = []string{"text/plain"}
			h["Content-Length"] = []string{"3"}
			_, _ = w.Write(body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	go func() {
		if err := srv.Serve(ln); err != http.ErrServerClosed {
			log.Fatal(err)
		}
	}()
	fmt.Printf("http://%s\n", ln.Addr())

	done := make(chan struct{})
	go func() { // stdin closed: the parent is done or gone
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-done:
	case <-sig:
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}
