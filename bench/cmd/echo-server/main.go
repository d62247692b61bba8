// Command echo-server is the upstream of the end-to-end benchmarks. It runs
// in its own process so that the client's allocations are measured alone.
//
// It listens on 127.0.0.1 on a free port — with -also N, on the same port
// of 127.0.0.2 to 127.0.0.N+1 too (one host of N addresses) — prints its
// base URL ("http://127.0.0.1:PORT") as the first line on stdout, and
// answers "ok\n" to every request. It exits when its standard input reaches end of file
// (the benchmark closes it, or the benchmark process died) or on SIGINT or
// SIGTERM.
package main

import (
	"context"
	"flag"
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
	also := flag.Int("also", 0, "also listen on the same port of 127.0.0.2 to 127.0.0.`N`+1")
	flag.Parse()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	lns := []net.Listener{ln}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	for i := range *also {
		l, err := net.Listen("tcp", net.JoinHostPort(fmt.Sprintf("127.0.0.%d", i+2), port))
		if err != nil {
			log.Fatal(err)
		}
		lns = append(lns, l)
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
	for _, l := range lns {
		go func() {
			if err := srv.Serve(l); err != http.ErrServerClosed {
				log.Fatal(err)
			}
		}()
	}
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
