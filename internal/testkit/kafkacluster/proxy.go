package kafkacluster

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
)

// A cluster started with Proxied serves a second listener on every node, PROXIED, which it
// advertises at the address of a TCP proxy in front of it. A client that bootstraps from
// ProxiedAddr learns only the proxies' addresses (Kafka advertises per listener), so Partition
// cuts that client, and only it, off from every broker, while the brokers, other clients and
// whatever else the client talks to (Postgres) carry on.

// Proxied gives every node a listener reached through a proxy that Partition can cut.
func Proxied() Option { return func(o *options) { o.proxied = true } }

// proxy forwards one node's proxied listener. While cut, it passes no byte either way, on old
// connections or new ones, as a network partition would; when healed, it closes the
// connections that lived through the cut (as a dropped connection-tracking state would) and
// forwards new ones again.
type proxy struct {
	listener net.Listener
	target   string // the node's PROXIED listener

	mu    sync.Mutex
	cut   bool
	heal  chan struct{} // closed when a cut ends
	conns map[net.Conn]bool
}

func startProxy(port int, target string) (*proxy, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("kafkacluster: proxy: %w", err)
	}
	p := &proxy{listener: l, target: target, conns: map[net.Conn]bool{}}
	go p.accept()
	return p, nil
}

func (p *proxy) accept() {
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return // closed
		}
		go p.serve(client)
	}
}

func (p *proxy) serve(client net.Conn) {
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	p.waitHealed(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	<-done
}

// pipe copies from src to dst, holding each chunk while the proxy is cut.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitHealed(src)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitHealed returns at once unless the proxy is cut; otherwise once the cut ends, having closed
// conn, which lived through it.
func (p *proxy) waitHealed(conn net.Conn) {
	p.mu.Lock()
	cut, heal := p.cut, p.heal
	p.mu.Unlock()
	if cut {
		<-heal
		conn.Close()
	}
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case cut && !p.cut:
		p.cut, p.heal = true, make(chan struct{})
	case !cut && p.cut:
		p.cut = false
		close(p.heal)
	}
}

func (p *proxy) close() {
	p.setCut(false)
	p.listener.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// ProxiedAddr returns the bootstrap servers of the proxied listeners (see Proxied).
func (c *Cluster) ProxiedAddr() string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.proxyPort))
	}
	return strings.Join(addrs, ",")
}

// Partition cuts the clients of ProxiedAddr off from every broker, until Heal.
func (c *Cluster) Partition() error { return c.setCut(true) }

// Heal ends a Partition.
func (c *Cluster) Heal() error { return c.setCut(false) }

func (c *Cluster) setCut(cut bool) error {
	if len(c.proxies) == 0 {
		return errors.New("kafkacluster: the cluster was not started with Proxied")
	}
	for _, p := range c.proxies {
		p.setCut(cut)
	}
	return nil
}
