package reaper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/outbox"
)

// heldReport is what /held serves: whether this reaper leads (only the leader holds records)
// and the records it holds back, oldest first.
type heldReport struct {
	Leader  bool               `json:"leader"`
	Records []event.HeldRecord `json:"records"`
	// KeysHidden: admin.hideKeys is set, so the records' keys are left out.
	KeysHidden bool `json:"keysHidden,omitempty"`
}

// operate runs the operators' commands on outbox o: held asks the running reaper at
// admin.address; the others work on the database directly.
func operate(env Env, command string, id int64, cfg File, o Outbox) error {
	ctx, cancel := context.WithTimeout(env.Context, 30*time.Second)
	defer cancel()
	h := o.Harvest
	h.Logger = slog.New(slog.DiscardHandler) // no harvester runs here, so its defaults need no warning
	h = h.WithDefaults()
	switch command {
	case "held":
		outboxName := ""
		if cfg.listed {
			outboxName = o.Name
		}
		return listHeld(ctx, env, cfg.Admin.Address, outboxName)
	case "dead-letter":
		err := h.deadLetterNow(ctx, id, "moved by an operator (reaper dead-letter)")
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "outbox record %d moved to %s; a leader holding it releases its key within %v\n",
			id, outbox.DeadLetterTable(h.OutboxTable), h.Limits.HeldCheckInterval)
	case "requeue":
		newID, err := h.requeue(ctx, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "dead letter %d requeued as outbox record %d, at the tail: it follows every record written before now\n", id, newID)
	}
	return nil
}

// listHeld prints the records the reaper serving address holds back, of the outbox named
// outboxName when it has several.
func listHeld(ctx context.Context, env Env, address, outboxName string) error {
	if address == "" {
		return errors.New("held: admin.address is not set, so no reaper serves /held")
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("held: admin.address %q: %w", address, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + HeldPath
	if outboxName != "" {
		url += "?" + (neturl.Values{OutboxParam: {outboxName}}).Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("held: is the reaper running? %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("held: %s answered %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var report heldReport
	if err := json.NewDecoder(resp.Body).Decode(&report); err != nil {
		return fmt.Errorf("held: %s: %w", url, err)
	}
	if !report.Leader {
		fmt.Fprintln(env.Stdout, "this reaper does not lead; ask the leader (the one whose goharvest_leader metric is 1)")
		return nil
	}
	w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tTOPIC\tKEY\tATTEMPTS\tSINCE\tERROR")
	for _, r := range report.Records {
		key := strconv.Quote(r.Key)
		if report.KeysHidden {
			key = "(hidden)"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.Topic, key, r.Attempts,
			r.Since.UTC().Format(time.RFC3339), strings.ReplaceAll(r.Error, "\n", " "))
	}
	w.Flush()
	fmt.Fprintf(env.Stdout, "%d held\n", len(report.Records))
	return nil
}
