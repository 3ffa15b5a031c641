// Starts Swagger UI on this server's own OpenAPI schema (no inline script: the page's CSP allows
// only this server's scripts). The API key goes in through "Authorize" and stays in the page.
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    persistAuthorization: false,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    layout: "BaseLayout",
  });
});
