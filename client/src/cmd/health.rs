//! `wpctl health`: the standard gRPC health check (`grpc.health.v1.Health/Check`) of the
//! daemon's service, e.g. as a liveness probe.

use serde_json::json;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use wpd_proto::v1::GetStatsRequest;

use crate::cmd::{Ctx, Report};
use crate::error::Error;

/// Runs `wpctl health`: prints `serving at ENDPOINT` (which daemon answered: the
/// system's or the user's own, when wpctl chose) and succeeds, or fails with one line.
pub async fn run(ctx: &Ctx) -> Result<(), Error> {
    report(ctx).await?.emit(ctx.json)
}

/// Asks the daemon's health service about `wpd.v1.Watchpoints`; any answer
/// but SERVING is an error ([`Error::NotServing`]).
pub async fn report(ctx: &Ctx) -> Result<Report, Error> {
    let channel = ctx.channel().await?;
    // The daemon answers health checks without a token; one is sent anyway
    // (harmless, and a proxy in front may want it).
    let request = ctx.deadline_request(HealthCheckRequest {
        service: wpd_proto::SERVICE_NAME.into(),
    })?;
    let resp = ctx
        .answer(HealthClient::new(channel).check(request))
        .await?;
    let status = ServingStatus::try_from(resp.status).unwrap_or(ServingStatus::Unknown);
    if status != ServingStatus::Serving {
        // The daemon says why in its stats, when it can answer them.
        let why = match ctx
            .unary(GetStatsRequest {}, |mut c, r| async move {
                c.get_stats(r).await
            })
            .await
        {
            Ok(s) => s.degraded,
            Err(_) => String::new(),
        };
        return Err(Error::NotServing {
            endpoint: ctx.endpoint.text.clone(),
            status: status.as_str_name().to_string(),
            why,
        });
    }
    Ok(Report::new(
        format!("serving at {}", ctx.endpoint.text),
        json!({
            "service": wpd_proto::SERVICE_NAME,
            "status": status.as_str_name(),
            "endpoint": ctx.endpoint.text,
        }),
    ))
}
