package sip

import "github.com/sluicelb/sluice/lb"

// generationRoutes returns the route table of g, nil when it has none.
func generationRoutes(g *lb.Generation) *lb.RouteTable { return nil }
