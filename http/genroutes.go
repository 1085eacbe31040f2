package http

import "github.com/sluicelb/sluice/lb"

// generationRoutes returns g's route table, nil when it has none.
func generationRoutes(g *lb.Generation) *lb.RouteTable { return nil }
