// Command tracewaits says where a client's slowest requests spent their
// time, from two Go execution traces taken at once on one machine: the
// client's (its requests inside runtime/trace regions) and the server's
// (GET /debug/pprof/trace). It matches each region with the server
// handler goroutine that started and ended within it, and splits the
// region into: until the server's connection reader was woken by the
// request's bytes (the client's send and the server's network poll), the
// server's connection goroutines until the handler started, the handler
// (of which runnable, waiting for a P; waiting for the connection's
// serve goroutine to take its writes; GC mark assists, the collector's
// charge for allocating while it marks), until the client's connection
// reader was woken by the last bytes (the server's last writes, the
// client's network poll), and the client's own time after that (its
// goroutines getting a P, reading the body).
//
// Why: under a flood, a victim's p99 is a few slow requests whose time is
// mostly outside the handler; the tier's request-duration histogram
// cannot say where. Go trace times are the monotonic clock, shared by the
// processes of one machine, so the two traces line up.
//
//	go run ./hack/bench -mode flood -flood-trace DIR ...   # writes the pairs
//	go run ./hack/tracewaits -client DIR/standalone-lists-bench.trace -server DIR/standalone-lists-server.trace
package main

import (
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"
)

func main() {
	clientPath := flag.String("client", "", "the client's trace (its requests in regions)")
	serverPath := flag.String("server", "", "the server's trace, taken over the same time")
	mark := flag.String("func", "front.(*Server).serveList", "a function (substring of its full name) only the handlers of the requests run")
	regionType := flag.String("region", "node-list", "the client's region type around each request")
	top := flag.Int("top", 10, "how many of the slowest requests to list")
	flag.Parse()
	if *clientPath == "" || *serverPath == "" {
		fmt.Fprintln(os.Stderr, "usage: tracewaits -client CLIENT.trace -server SERVER.trace [-func NAME] [-region TYPE] [-top N]")
		os.Exit(2)
	}
	if err := run(*clientPath, *serverPath, *mark, *regionType, *top); err != nil {
		fmt.Fprintln(os.Stderr, "tracewaits:", err)
		os.Exit(1)
	}
}

func run(clientPath, serverPath, mark, regionType string, top int) error {
	read := func(path, mark string) (*parsed, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		p, err := parse(f, mark, regionType)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return p, nil
	}
	client, err := read(clientPath, "")
	if err != nil {
		return err
	}
	server, err := read(serverPath, mark)
	if err != nil {
		return err
	}
	if len(client.regions) == 0 {
		return fmt.Errorf("%s: no region of type %q", clientPath, regionType)
	}
	all := explain(client, server)
	matched := 0
	for _, b := range all {
		if b.handled {
			matched++
		}
	}
	fmt.Printf("%d requests (regions %q), %d matched with a handler running %q (\"-\": none started and ended within the request, e.g. it began before the server's trace)\n", len(all), regionType, matched, mark)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "request\tclient ms\tuntil the server saw it\tserver, to the handler\thandler\t(runnable\twrites\tGC assists)\tuntil the client saw the last bytes\tclient, after them\t")
	row := func(name string, b breakdown) {
		if !b.handled {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t\n", name, ms(b.total))
			return
		}
		lastBytes := min(max(b.clientNoticed, 0), b.after)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, ms(b.total), ms(b.toNoticed), ms(b.toHandler),
			ms(b.handler), ms(b.handlerRunnable), ms(b.handlerWrites), ms(b.handlerAssists), ms(lastBytes), ms(b.after-lastBytes))
	}
	for i, b := range all[:min(top, len(all))] {
		row(fmt.Sprintf("#%d", i+1), b)
	}
	var handled []breakdown
	for _, b := range all {
		if b.handled {
			handled = append(handled, b)
		}
	}
	if len(handled) > 0 {
		row("median matched", handled[len(handled)/2])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var assisted int
	var assists time.Duration
	for _, b := range handled {
		if b.handlerAssists > 0 {
			assisted++
			assists += b.handlerAssists
		}
	}
	fmt.Printf("GC mark assists in %d of the %d matched handlers, %s ms in all\n", assisted, len(handled), ms(assists))
	// Shares of the slowest requests' time, summed.
	var total time.Duration
	var parts [5]time.Duration
	n := 0
	for _, b := range all[:min(top, len(all))] {
		if !b.handled {
			continue
		}
		lastBytes := min(max(b.clientNoticed, 0), b.after)
		for i, d := range []time.Duration{b.toNoticed, b.toHandler, b.handler, lastBytes, b.after - lastBytes} {
			parts[i] += d
		}
		total += b.total
		n++
	}
	if n > 0 && total > 0 {
		share := func(d time.Duration) float64 { return 100 * float64(d) / float64(total) }
		fmt.Printf("the %d slowest matched: until the server saw them %.0f%%, the server to the handler %.0f%%, the handler %.0f%%, until the client saw the last bytes %.0f%%, the client after them %.0f%%\n",
			n, share(parts[0]), share(parts[1]), share(parts[2]), share(parts[3]), share(parts[4]))
	}
	return nil
}
