// Command httpdemo is the demo's web server and client, so the demo needs
// neither python nor curl: "httpdemo serve ADDR NAME" answers every request
// with who it is and whom it sees; "httpdemo get URL" prints the answer.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: httpdemo serve ADDR NAME | httpdemo get URL")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		name := "container"
		if len(os.Args) > 3 {
			name = os.Args[3]
		}
		http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			fmt.Fprintf(w, "hello from %s; you came from %s\n", name, host)
		})
		srv := &http.Server{Addr: os.Args[2], ReadHeaderTimeout: 5 * time.Second}
		if err := srv.ListenAndServe(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "get":
		c := &http.Client{Timeout: 3 * time.Second}
		resp, err := c.Get(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(os.Stdout, resp.Body)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}
