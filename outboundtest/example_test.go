package outboundtest_test

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/outboundhq/outbound/outboundtest"
)

// A connection reset after the server processed a POST: the client sees an
// error, yet the order was executed, and sending it again executes it twice.
func ExampleServer() {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.Enqueue(outboundtest.ResetAfterRead())
	client := &http.Client{Transport: s.Transport()}

	for range 2 {
		req, _ := http.NewRequest("POST", s.URL+"/orders", strings.NewReader(`{"item":42}`))
		req.Header.Set(outboundtest.IDHeader, "order-42")
		resp, err := client.Do(req)
		if err != nil {
			fmt.Printf("error; executions: %d\n", s.Executions("order-42"))
			continue
		}
		resp.Body.Close()
		fmt.Printf("%d; executions: %d\n", resp.StatusCode, s.Executions("order-42"))
	}
	// Output:
	// error; executions: 1
	// 200; executions: 2
}

// An outage and the recovery on the same URL.
func ExampleServer_Pause() {
	s := outboundtest.NewServer(outboundtest.H2C)
	defer s.Close()
	client := &http.Client{Transport: s.Transport()}

	s.Pause()
	_, err := client.Get(s.URL)
	fmt.Println("during the outage:", err != nil)

	s.Resume()
	resp, err := client.Get(s.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("after it:", resp.StatusCode)
	// Output:
	// during the outage: true
	// after it: 200
}
