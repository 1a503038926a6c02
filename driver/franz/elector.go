package franz

import (
	"errors"

	"github.com/goharvest/goharvest/driver"
)

var _ driver.Kafka = (*Client)(nil)

// NewElector joins the leader election (Fast NELI) on kgo's group client.
//
// Work in progress on this branch: the election lands before the client can be selected.
func (c *Client) NewElector(driver.ElectorConfig) (driver.Elector, error) {
	return nil, errors.New("franz: the election is not written yet")
}
