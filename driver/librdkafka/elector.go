package librdkafka

import (
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/neli"
)

// Elector gives the engine a neli election: its Pulse, Partitions, Close and Ping, and neli's
// states read as the engine asks about them.
func Elector(n *neli.Neli) driver.Elector { return elector{n} }

type elector struct{ *neli.Neli }

var (
	_ driver.Elector = elector{}
	_ driver.Pinger  = elector{}
)

func (e elector) Leading() bool { return e.State() == neli.Leader }
func (e elector) Fenced() bool  { return e.State() == neli.Fenced }
