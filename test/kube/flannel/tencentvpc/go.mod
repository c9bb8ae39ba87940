// A stand-in for the Tencent Cloud VPC SDK, which the Go module proxy does
// not serve: flanneld's main links its tencent-vpc backend, which the
// suite never selects (it runs VXLAN). It has the names that backend
// uses, and every call fails.
module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

go 1.24.0
