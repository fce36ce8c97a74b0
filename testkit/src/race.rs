//! Races on the API server, made to happen.

/// `client`, where each patch of a Lease waits until `racers` patches are under way: every
/// candidate has read the Lease before any writes it, the worst interleaving.
pub fn racing(client: kube::Client, racers: usize) -> kube::Client {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(racers));
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (client, barrier) = (client.clone(), barrier.clone());
        async move {
            if request.method() == http::Method::PATCH && request.uri().path().contains("/leases/")
            {
                barrier.wait().await;
            }
            client.send(request).await.map_err(tower::BoxError::from)
        }
    });
    kube::Client::new(service, "default")
}
