// Package v20170312 stands in for the Tencent Cloud VPC API's client
// (see ../go.mod): the types and calls flannel's tencent-vpc backend
// names, each call failing.
package v20170312

import "errors"

var errStandIn = errors.New("the Tencent Cloud VPC API is not in this build of flanneld (the kube suite's stand-in)")

type Client struct{}

func NewClientWithSecretId(id, secret, region string) (*Client, error) { return nil, errStandIn }

type Filter struct {
	Name   *string
	Values []*string
}

type Route struct {
	RouteId              *uint64
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteType            *string
	Enabled              *bool
}

type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

type DescribeRouteTablesRequest struct{ Filters []*Filter }

type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

type routesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type (
	DeleteRoutesRequest  routesRequest
	CreateRoutesRequest  routesRequest
	DeleteRoutesResponse struct{}
	CreateRoutesResponse struct{}
)

func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest {
	return &DescribeRouteTablesRequest{}
}
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

func (*Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errStandIn
}
func (*Client) DeleteRoutes(*DeleteRoutesRequest) (*DeleteRoutesResponse, error) {
	return nil, errStandIn
}
func (*Client) CreateRoutes(*CreateRoutesRequest) (*CreateRoutesResponse, error) {
	return nil, errStandIn
}
