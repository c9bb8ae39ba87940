// Command podserver is the process of the kube suite's pods, built static
// into images of its own (nothing is pulled): "podserver serve NAME PORT"
// answers every TCP connection and UDP datagram on PORT (both families)
// with "NAME sees PEER", as the other suites' servers do; "podserver
// pause" is the sandbox's process, which waits for its end.
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "pause" {
		wait()
		return
	}
	if len(os.Args) != 4 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: podserver serve NAME PORT | podserver pause")
		os.Exit(2)
	}
	name, port := os.Args[2], os.Args[3]
	tcp, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fail(err)
	}
	udp, err := net.ListenPacket("udp", ":"+port)
	if err != nil {
		fail(err)
	}
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				fail(err)
			}
			fmt.Fprintf(c, "%s sees %s\n", name, host(c.RemoteAddr()))
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := udp.ReadFrom(buf)
			if err != nil {
				fail(err)
			}
			_, _ = udp.WriteTo([]byte(fmt.Sprintf("%s sees %s\n", name, host(from))), from)
		}
	}()
	fmt.Printf("%s serving tcp and udp on :%s\n", name, port)
	wait()
}

// wait returns on SIGTERM or SIGINT (a pod's process is its namespace's
// init: signals without a handler do not end it).
func wait() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}

func host(a net.Addr) string {
	h, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return h
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
