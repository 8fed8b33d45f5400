// Command grpchealth is the gRPC health server of the probe tests: it
// answers the standard grpc.health.v1.Health service on -port, SERVING
// for -serve-for (forever when 0) and then, per -then, NOT_SERVING
// ("not-serving") or not at all ("stop": the listener closes while the
// process lives on). A -service name is SERVING likewise; any other
// service is unknown (NOT_FOUND). It exits on SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	port := flag.Int("port", 9000, "port to listen on")
	service := flag.String("service", "", "a named service, besides the server's own (\"\")")
	serveFor := flag.Duration("serve-for", 0, "how long to report SERVING (0: for ever)")
	then := flag.String("then", "not-serving", "after -serve-for: not-serving or stop")
	flag.Parse()
	if *then != "not-serving" && *then != "stop" {
		fmt.Fprintf(os.Stderr, "grpchealth: -then %q is neither not-serving nor stop\n", *then)
		os.Exit(2)
	}

	l, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		fmt.Fprintf(os.Stderr, "grpchealth: %v\n", err)
		os.Exit(1)
	}
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	if *service != "" {
		hs.SetServingStatus(*service, healthpb.HealthCheckResponse_SERVING)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	fmt.Printf("grpchealth: serving on :%d\n", *port)

	var turn <-chan time.Time
	if *serveFor > 0 {
		turn = time.After(*serveFor)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	for {
		select {
		case <-turn:
			turn = nil
			if *then == "stop" {
				fmt.Println("grpchealth: stopping the server")
				srv.Stop()
			} else {
				fmt.Println("grpchealth: NOT_SERVING")
				hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
				if *service != "" {
					hs.SetServingStatus(*service, healthpb.HealthCheckResponse_NOT_SERVING)
				}
			}
		case err := <-served:
			if err != nil && turn != nil {
				fmt.Fprintf(os.Stderr, "grpchealth: %v\n", err)
				os.Exit(1)
			}
			served = nil // stopped as told: live on without a server
		case <-signals:
			srv.Stop()
			os.Exit(0)
		}
	}
}
