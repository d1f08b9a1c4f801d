{{ config(materialized='table') }}
select id, name, city from {{ ref('people') }}
