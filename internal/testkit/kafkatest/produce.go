package kafkatest

import (
	"errors"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// Produce queues m on p, asking again while p looks m's topic up (driver.ErrTopicPending) for
// up to within, and returns Produce's first other answer (nil once queued), or ErrTopicPending
// at the deadline. Both drivers look a topic up in the background and give no signal when they
// are done, so it polls, as the engine does.
func Produce(p driver.KafkaProducer, m driver.Message, within time.Duration) error {
	var err error
	testwait.Until(within, func() bool {
		err = p.Produce(m)
		return !errors.Is(err, driver.ErrTopicPending)
	})
	return err
}
