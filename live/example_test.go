package live_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/live"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

type TicketOpened struct {
	Title string `json:"title"`
}

// A live feed on an application's own server: the feed's consumer runs on
// the application's dispatcher, the Authorize callback says which tenant a
// request may watch, and a browser's EventSource gets each committed event
// of that tenant.
func ExampleNew() {
	ctx := context.Background()
	// An application reads these from its configuration.
	url, schema := pgtest.ExampleDatabase()
	reg := projector.NewRegistry()
	ticketOpened, err := projector.Define[TicketOpened](reg, "ticket.opened")
	if err != nil {
		fmt.Println(err)
		return
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		fmt.Println(err)
		return
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}

	feed, err := live.New(live.Config{
		Store:      store,
		EventTypes: []string{ticketOpened.Name()},
		Payloads:   true,
		Authorize: func(r *http.Request) (string, error) {
			// A real application checks its session here.
			if r.Header.Get("Authorization") != "Bearer acme-token" {
				return "", live.ErrUnauthenticated
			}
			return "acme", nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{feed.Projection()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := d.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer d.Stop(ctx)

	// Loopback, unless the application means otherwise.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /live", feed)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(feed.Close)
	go srv.Serve(ln)
	defer srv.Shutdown(ctx)

	// What a browser's new EventSource("/live") does.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ln.Addr().String()+"/live", nil)
	req.Header.Set("Authorization", "Bearer acme-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status, resp.Header.Get("Content-Type"))
	// Wait until the stream is live, then append.
	for feed.Clients() == 0 {
		time.Sleep(time.Millisecond)
	}
	for _, tenant := range []string{"other", "acme"} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.TenantStream(tenant, "ticket", "t-1"), projector.NoStream, TicketOpened{Title: "Printer on fire"})
			return err
		}); err != nil {
			fmt.Println(err)
			return
		}
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			fmt.Println(line)
		case strings.HasPrefix(line, "data: "):
			var ev struct {
				Tenant  string       `json:"tenant"`
				Payload TicketOpened `json:"payload"`
			}
			if err := json.Unmarshal([]byte(line[6:]), &ev); err != nil {
				fmt.Println(err)
				return
			}
			fmt.Println(ev.Tenant, ev.Payload.Title)
			return
		}
	}
	// Output:
	// 200 OK text/event-stream
	// event: ticket.opened
	// acme Printer on fire
}
